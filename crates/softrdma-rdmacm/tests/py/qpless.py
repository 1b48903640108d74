"""An rdma_cm connection without a QP, as UCX's rdmacm transport makes
them: rdma_connect and rdma_accept name a QP number (conn_param.qp_num)
and no id has a QP. The active side gets CONNECT_RESPONSE (with the
passive side's private data), reads the RTR attributes from
rdma_init_qp_attr, and confirms with rdma_establish; only then does the
passive side get ESTABLISHED. ECE as rdma-core's flow for such ids
has it: the client offers two options (rdma_set_local_ece), the server
reads them (rdma_get_remote_ece) and answers with one, which the client
reads after CONNECT_RESPONSE. Run by tests/debian.rs
(pyverbs_connection_without_qps) through pyverbs (python3-pyverbs) on
the drop-in librdmacm.so.1:

    qpless.py server ADDR PORT | qpless.py client ADDR PORT
"""
import sys

import pyverbs.cm_enums as ce
import pyverbs.enums as ve
from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from pyverbs.qp import ECE

VENDOR = 0x00535201  # softrdma's ECE vendor ID; option bit 0: selective repeat

role, addr, port = sys.argv[1], sys.argv[2], sys.argv[3]
ch = CMEventChannel()


def expect(kind):
    ev = CMEvent(ch)
    if ev.event_type != kind:
        sys.exit(f"{role}: event {ev.event_type}, expected {kind}")
    return ev


if role == "server":
    ai = AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP,
                  flags=ce.RAI_PASSIVE)
    listener = CMID(creator=ch, port_space=ce.RDMA_PS_TCP)
    listener.bind_addr(ai)
    listener.listen()
    print("listening", flush=True)
    ev = expect(ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    cid = CMID(creator=ev, listen_id=listener)
    ev.ack_cm_event()
    # RTR's path and peer QP are known from the REQ on (UCX reads them).
    attr, _mask = cid.init_qp_attr(ve.IBV_QPS_RTR)
    if attr.dest_qp_num != 0x456:
        sys.exit(f"server: RTR dest_qp_num {attr.dest_qp_num:#x}, want 0x456")
    offer = cid.get_remote_ece()
    if (offer.vendor_id, offer.options) != (VENDOR, 0b11):
        sys.exit(f"server: ECE offer {offer.vendor_id:#x}/{offer.options:#x}")
    print("server read the ECE offer", flush=True)
    cid.set_local_ece(ECE(vendor_id=VENDOR, options=0b01))
    cid.accept(ConnParam(qp_num=0x123))
    ev = expect(ce.RDMA_CM_EVENT_ESTABLISHED)
    ev.ack_cm_event()
    print("server established", flush=True)
    ev = expect(ce.RDMA_CM_EVENT_DISCONNECTED)
    ev.ack_cm_event()
    print("server done", flush=True)
else:
    cid = CMID(creator=ch, port_space=ce.RDMA_PS_TCP)
    dai = AddrInfo(dst=addr, dst_service=port, port_space=ce.RDMA_PS_TCP)
    cid.resolve_addr(dai)
    expect(ce.RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    cid.resolve_route()
    expect(ce.RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
    cid.set_local_ece(ECE(vendor_id=VENDOR, options=0b11))
    cid.connect(ConnParam(qp_num=0x456))
    ev = expect(ce.RDMA_CM_EVENT_CONNECT_RESPONSE)
    answer = cid.get_remote_ece()
    if (answer.vendor_id, answer.options) != (VENDOR, 0b01):
        sys.exit(f"client: ECE answer {answer.vendor_id:#x}/{answer.options:#x}")
    print("client read the ECE answer", flush=True)
    attr, _mask = cid.init_qp_attr(ve.IBV_QPS_RTR)
    if attr.dest_qp_num != 0x123:
        sys.exit(f"client: RTR dest_qp_num {attr.dest_qp_num:#x}, want 0x123")
    ev.ack_cm_event()
    cid.establish()
    print("client established", flush=True)
    cid.disconnect()
    print("client done", flush=True)
