//! Packet and error counters, per device and per QP, named like the
//! `rdma statistic` counters so that operators recognise them.

/// A set of counters. The device keeps one, and every QP its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Packets sent again after a NAK, RNR NAK or timeout.
    pub retransmits: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_rcvd: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_rcvd: u64,
    /// Local ACK timeouts that fired.
    pub timeouts: u64,
    /// Duplicate requests seen by the responder.
    pub duplicates: u64,
    /// Packets dropped because the ICRC did not match.
    pub icrc_errors: u64,
    /// Requests dropped because they arrived out of sequence.
    pub out_of_sequence: u64,
    /// Packets that could not be parsed.
    pub malformed: u64,
    /// Packets for a QP that does not exist or is in the wrong state.
    pub dropped: u64,
    /// UD packets with the wrong Q_Key.
    pub qkey_violations: u64,
    /// Packets (requests or responses, any QP type) whose BTH P_Key does
    /// not match the QP's P_Key under the IBTA rule; dropped.
    pub pkey_violations: u64,
    /// Completions lost to full CQs.
    pub cq_overruns: u64,
    /// Error NAKs sent (invalid request, remote access, remote operational).
    pub error_naks_sent: u64,
    /// CNPs received.
    pub cnp_rcvd: u64,
    /// CNPs sent (the notification point answering CE marks).
    pub cnp_sent: u64,
    /// Packets received with the ECN codepoint CE (congestion experienced).
    pub ecn_ce_rcvd: u64,
    /// IPv4 packets whose ICRC matched only with a non-zero IP ID recovered
    /// from the CRC (senders such as Linux rxe; see `icrc::recover_ipv4_id`).
    pub icrc_ip_id_recovered: u64,
    /// MADs QP1 took in, for the management agents.
    pub gsi_mads_rcvd: u64,
    /// MADs sent from QP1.
    pub gsi_mads_sent: u64,
    /// Packets for QP1 that were not MADs it takes, or found its queue full.
    pub gsi_mads_dropped: u64,
    /// Selective repeat: single packets sent again (also in `retransmits`).
    pub sr_retransmits: u64,
    /// Selective repeat: requests a responder kept because they arrived
    /// ahead of a missing PSN.
    pub ooo_held: u64,
}

impl Counters {
    /// Field names and values, for tools and the stats socket.
    pub fn fields(&self) -> [(&'static str, u64); 28] {
        [
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("retransmits", self.retransmits),
            ("seq_naks_sent", self.seq_naks_sent),
            ("seq_naks_rcvd", self.seq_naks_rcvd),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_rcvd", self.rnr_naks_rcvd),
            ("timeouts", self.timeouts),
            ("duplicates", self.duplicates),
            ("icrc_errors", self.icrc_errors),
            ("out_of_sequence", self.out_of_sequence),
            ("malformed", self.malformed),
            ("dropped", self.dropped),
            ("qkey_violations", self.qkey_violations),
            ("pkey_violations", self.pkey_violations),
            ("cq_overruns", self.cq_overruns),
            ("error_naks_sent", self.error_naks_sent),
            ("cnp_rcvd", self.cnp_rcvd),
            ("cnp_sent", self.cnp_sent),
            ("ecn_ce_rcvd", self.ecn_ce_rcvd),
            ("icrc_ip_id_recovered", self.icrc_ip_id_recovered),
            ("gsi_mads_rcvd", self.gsi_mads_rcvd),
            ("gsi_mads_sent", self.gsi_mads_sent),
            ("gsi_mads_dropped", self.gsi_mads_dropped),
            ("sr_retransmits", self.sr_retransmits),
            ("ooo_held", self.ooo_held),
        ]
    }
}
