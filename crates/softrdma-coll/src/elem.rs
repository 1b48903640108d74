//! Element types and reduction operators.

use half::{bf16, f16};
use std::fmt;
use std::str::FromStr;

/// The data types a collective carries (nccl-tests' names in `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned byte.
    U8,
}

impl DataType {
    /// Every type, in a fixed order.
    pub const ALL: [DataType; 7] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
    ];
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 => 8,
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::U8 => 1,
        }
    }
    /// Floating point (results within a bound, not bit-exact, across algorithms).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
            DataType::U8 => "uint8",
        })
    }
}

impl FromStr for DataType {
    type Err = String;
    /// nccl-tests' names (`float`, `double`, `half`, `bfloat16`, `int32`,
    /// `int64`, `uint8`) and the Rust ones (`f32`, `i64`, …).
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            "half" | "f16" | "float16" => DataType::F16,
            "bfloat16" | "bf16" => DataType::Bf16,
            "int32" | "int" | "i32" => DataType::I32,
            "int64" | "i64" => DataType::I64,
            "uint8" | "u8" => DataType::U8,
            _ => {
                return Err(format!(
                    "unknown data type {s:?} (float, double, half, bfloat16, int32, int64, uint8)"
                ))
            }
        })
    }
}

/// Reduction operators. `Avg` is the sum divided by the world size (integer
/// division for integer types, after a wrapping sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over the ranks.
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        })
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => return Err(format!("unknown op {s:?} (sum, prod, min, max, avg)")),
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type a collective can carry: plain old data with its reduction rules.
/// Sealed: the byte views in `bytes.rs` rely on every implementor having
/// no padding and every bit pattern valid.
pub trait Element:
    Copy + Send + Sync + PartialEq + fmt::Debug + Default + sealed::Sealed + 'static
{
    /// Its [`DataType`].
    const DTYPE: DataType;
    /// `a op b` for Sum/Prod/Min/Max (Avg reduces as Sum).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Divides by the world size (for Avg).
    fn div_n(self, n: usize) -> Self;
    /// As f64 (tests and checks).
    fn to_f64(self) -> f64;
    /// From f64 (tests and benchmarks), rounding or wrapping.
    fn from_f64(v: f64) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div_n(self, n: usize) -> Self {
                self / (n as $t)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as i64 as $t
            }
        }
    };
}
int_elem!(i32, DataType::I32);
int_elem!(i64, DataType::I64);
int_elem!(u8, DataType::U8);

macro_rules! float_elem {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div_n(self, n: usize) -> Self {
                self / (n as $t)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
float_elem!(f32, DataType::F32);
float_elem!(f64, DataType::F64);

macro_rules! half_elem {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $d;
            /// Computed in f32 and rounded once, as GPUs' half reductions do.
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                <$t>::from_f32(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                })
            }
            fn div_n(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}
half_elem!(f16, DataType::F16);
half_elem!(bf16, DataType::Bf16);

/// `acc[i] = acc[i] op x[i]`.
#[inline]
pub fn reduce_into<T: Element>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    debug_assert_eq!(acc.len(), x.len());
    for (a, b) in acc.iter_mut().zip(x) {
        *a = T::combine(op, *a, *b);
    }
}

/// `acc[i] = x[i] op acc[i]` (the incoming operand first: keeps the
/// lower rank on the left, whichever rank computes).
#[inline]
pub fn reduce_into_rev<T: Element>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    debug_assert_eq!(acc.len(), x.len());
    for (a, b) in acc.iter_mut().zip(x) {
        *a = T::combine(op, *b, *a);
    }
}
