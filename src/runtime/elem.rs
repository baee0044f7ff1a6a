//! Element types and reduction kernels shared by every CPU backend.
//!
//! Collectives move bytes; [`DType`] says how to combine them. Kernels are plain loops over
//! slices that LLVM vectorizes; f16/bf16 are widened to f32 for each operation and rounded back,
//! which is commutative, so `a op b` and `b op a` give the same bits (needed for recursive
//! doubling to stay bit-identical across ranks).

use half::{bf16, f16};

/// Reduction operators (PyTorch's `ReduceOp` subset the issue asks for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Sum, then divide by the world size (integers: truncating division).
    Avg,
    Max,
    Min,
}

/// The element types the runtime reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I32,
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// A host element type the collectives accept.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// `dst[i] = dst[i] op src[i]` for Sum/Max/Min (Avg reduces as Sum).
    fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp);
    /// `dst[i] = a[i] op b[i]` (one pass instead of a copy then [`Element::reduce`]).
    fn reduce_into(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp);
    /// `v = inout[i] op other[i]` (or `other[i] op inout[i]` when `!inout_first`), stored in
    /// both `inout[i]` and `dst[i]`: a fold plus a copy in one pass.
    fn fold_dual(
        dst: &mut [Self],
        inout: &mut [Self],
        other: &[Self],
        inout_first: bool,
        op: ReduceOp,
    );
    /// `dst[i] /= n` (the Avg epilogue).
    fn div(dst: &mut [Self], n: usize);
}

macro_rules! native_elem {
    ($t:ty, $d:expr, $max:expr, $min:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = add(*d, *s);
                        }
                    }
                    ReduceOp::Max => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = $max(*d, *s);
                        }
                    }
                    ReduceOp::Min => {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = $min(*d, *s);
                        }
                    }
                }
            }
            fn reduce_into(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
                // Equal lengths up front let LLVM drop the bounds checks and vectorize.
                let n = dst.len().min(a.len()).min(b.len());
                let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        for i in 0..n {
                            dst[i] = add(a[i], b[i]);
                        }
                    }
                    ReduceOp::Max => {
                        for i in 0..n {
                            dst[i] = $max(a[i], b[i]);
                        }
                    }
                    ReduceOp::Min => {
                        for i in 0..n {
                            dst[i] = $min(a[i], b[i]);
                        }
                    }
                }
            }
            fn fold_dual(
                dst: &mut [Self],
                inout: &mut [Self],
                other: &[Self],
                inout_first: bool,
                op: ReduceOp,
            ) {
                let n = dst.len().min(inout.len()).min(other.len());
                let (dst, inout, other) = (&mut dst[..n], &mut inout[..n], &other[..n]);
                // One loop per (operator, operand order) so each is a branch-free vector loop.
                macro_rules! go {
                    ($f:expr) => {
                        if inout_first {
                            for i in 0..n {
                                let v = $f(inout[i], other[i]);
                                inout[i] = v;
                                dst[i] = v;
                            }
                        } else {
                            for i in 0..n {
                                let v = $f(other[i], inout[i]);
                                inout[i] = v;
                                dst[i] = v;
                            }
                        }
                    };
                }
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => go!(add),
                    ReduceOp::Max => go!($max),
                    ReduceOp::Min => go!($min),
                }
            }
            fn div(dst: &mut [Self], n: usize) {
                let n = n as $t;
                for d in dst.iter_mut() {
                    *d /= n;
                }
            }
        }
    };
}

#[inline(always)]
fn add<T: std::ops::Add<Output = T> + WrappingAdd>(a: T, b: T) -> T {
    a.wadd(b)
}

/// Integer sums wrap (as NCCL and gloo do) instead of panicking in debug builds.
trait WrappingAdd {
    fn wadd(self, b: Self) -> Self;
}
impl WrappingAdd for f32 {
    #[inline(always)]
    fn wadd(self, b: Self) -> Self {
        self + b
    }
}
impl WrappingAdd for f64 {
    #[inline(always)]
    fn wadd(self, b: Self) -> Self {
        self + b
    }
}
impl WrappingAdd for i32 {
    #[inline(always)]
    fn wadd(self, b: Self) -> Self {
        self.wrapping_add(b)
    }
}
impl WrappingAdd for i64 {
    #[inline(always)]
    fn wadd(self, b: Self) -> Self {
        self.wrapping_add(b)
    }
}

// f32::max ignores NaN; fine for gradients, and it is commutative for non-NaN values.
native_elem!(f32, DType::F32, f32::max, f32::min);
native_elem!(f64, DType::F64, f64::max, f64::min);
native_elem!(i32, DType::I32, std::cmp::max, std::cmp::min);
native_elem!(i64, DType::I64, std::cmp::max, std::cmp::min);

macro_rules! half_elem {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce(dst: &mut [Self], src: &[Self], op: ReduceOp) {
                for (d, s) in dst.iter_mut().zip(src) {
                    let (a, b) = (d.to_f32(), s.to_f32());
                    let r = match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + b,
                        ReduceOp::Max => a.max(b),
                        ReduceOp::Min => a.min(b),
                    };
                    *d = <$t>::from_f32(r);
                }
            }
            fn reduce_into(dst: &mut [Self], a: &[Self], b: &[Self], op: ReduceOp) {
                for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
                    let (x, y) = (x.to_f32(), y.to_f32());
                    let r = match op {
                        ReduceOp::Sum | ReduceOp::Avg => x + y,
                        ReduceOp::Max => x.max(y),
                        ReduceOp::Min => x.min(y),
                    };
                    *d = <$t>::from_f32(r);
                }
            }
            fn fold_dual(
                dst: &mut [Self],
                inout: &mut [Self],
                other: &[Self],
                inout_first: bool,
                op: ReduceOp,
            ) {
                for ((d, io), o) in dst.iter_mut().zip(inout.iter_mut()).zip(other) {
                    let (x, y) = if inout_first {
                        (io.to_f32(), o.to_f32())
                    } else {
                        (o.to_f32(), io.to_f32())
                    };
                    let r = match op {
                        ReduceOp::Sum | ReduceOp::Avg => x + y,
                        ReduceOp::Max => x.max(y),
                        ReduceOp::Min => x.min(y),
                    };
                    *io = <$t>::from_f32(r);
                    *d = *io;
                }
            }
            fn div(dst: &mut [Self], n: usize) {
                let n = n as f32;
                for d in dst.iter_mut() {
                    *d = <$t>::from_f32(d.to_f32() / n);
                }
            }
        }
    };
}
half_elem!(f16, DType::F16);
half_elem!(bf16, DType::BF16);

/// Copies bytes into a freshly allocated (hence aligned) `Vec<T>`.
fn pod_to_vec<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); b.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
    v
}

/// Byte-level dispatch: `dst op= src` for buffers holding `dtype` elements.
///
/// Buffers produced by the runtime are always aligned (they come from typed slices or 64-byte
/// aligned scratch); a misaligned one falls back to copying through an aligned temporary.
pub fn reduce_bytes(dst: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) {
    fn go<T: Element>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
        match (
            bytemuck::try_cast_slice_mut::<u8, T>(dst),
            bytemuck::try_cast_slice::<u8, T>(src),
        ) {
            (Ok(d), Ok(s)) => T::reduce(d, s, op),
            _ => {
                let mut d: Vec<T> = pod_to_vec(dst);
                let s: Vec<T> = pod_to_vec(src);
                T::reduce(&mut d, &s, op);
                dst.copy_from_slice(bytemuck::cast_slice(&d));
            }
        }
    }
    debug_assert_eq!(dst.len(), src.len());
    match dtype {
        DType::F32 => go::<f32>(dst, src, op),
        DType::F64 => go::<f64>(dst, src, op),
        DType::F16 => go::<f16>(dst, src, op),
        DType::BF16 => go::<bf16>(dst, src, op),
        DType::I32 => go::<i32>(dst, src, op),
        DType::I64 => go::<i64>(dst, src, op),
    }
}

/// Byte-level `dst = a op b` for buffers holding `dtype` elements (misaligned buffers go
/// through [`reduce_bytes`]).
pub fn reduce_into_bytes(dst: &mut [u8], a: &[u8], b: &[u8], dtype: DType, op: ReduceOp) {
    fn go<T: Element>(dst: &mut [u8], a: &[u8], b: &[u8], op: ReduceOp) {
        match (
            bytemuck::try_cast_slice_mut::<u8, T>(dst),
            bytemuck::try_cast_slice::<u8, T>(a),
            bytemuck::try_cast_slice::<u8, T>(b),
        ) {
            (Ok(d), Ok(x), Ok(y)) => T::reduce_into(d, x, y, op),
            _ => {
                dst.copy_from_slice(a);
                reduce_bytes(dst, b, T::DTYPE, op);
            }
        }
    }
    debug_assert!(dst.len() == a.len() && dst.len() == b.len());
    match dtype {
        DType::F32 => go::<f32>(dst, a, b, op),
        DType::F64 => go::<f64>(dst, a, b, op),
        DType::F16 => go::<f16>(dst, a, b, op),
        DType::BF16 => go::<bf16>(dst, a, b, op),
        DType::I32 => go::<i32>(dst, a, b, op),
        DType::I64 => go::<i64>(dst, a, b, op),
    }
}

/// Byte-level [`Element::fold_dual`]: `inout = inout op other` (operands swapped when
/// `!inout_first`), also stored in `dst`.
pub fn fold_dual_bytes(
    dst: &mut [u8],
    inout: &mut [u8],
    other: &[u8],
    inout_first: bool,
    dtype: DType,
    op: ReduceOp,
) {
    fn go<T: Element>(dst: &mut [u8], inout: &mut [u8], other: &[u8], first: bool, op: ReduceOp) {
        match (
            bytemuck::try_cast_slice_mut::<u8, T>(dst),
            bytemuck::try_cast_slice_mut::<u8, T>(inout),
            bytemuck::try_cast_slice::<u8, T>(other),
        ) {
            (Ok(d), Ok(io), Ok(o)) => T::fold_dual(d, io, o, first, op),
            (_, _, _) => {
                let mut d: Vec<T> = pod_to_vec(dst);
                let mut io: Vec<T> = pod_to_vec(inout);
                let o: Vec<T> = pod_to_vec(other);
                T::fold_dual(&mut d, &mut io, &o, first, op);
                dst.copy_from_slice(bytemuck::cast_slice(&d));
                inout.copy_from_slice(bytemuck::cast_slice(&io));
            }
        }
    }
    debug_assert!(dst.len() == inout.len() && dst.len() == other.len());
    match dtype {
        DType::F32 => go::<f32>(dst, inout, other, inout_first, op),
        DType::F64 => go::<f64>(dst, inout, other, inout_first, op),
        DType::F16 => go::<f16>(dst, inout, other, inout_first, op),
        DType::BF16 => go::<bf16>(dst, inout, other, inout_first, op),
        DType::I32 => go::<i32>(dst, inout, other, inout_first, op),
        DType::I64 => go::<i64>(dst, inout, other, inout_first, op),
    }
}

/// Byte-level Avg epilogue: `dst /= n`.
pub fn div_bytes(dst: &mut [u8], dtype: DType, n: usize) {
    fn go<T: Element>(dst: &mut [u8], n: usize) {
        match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
            Ok(d) => T::div(d, n),
            Err(_) => {
                let mut d: Vec<T> = pod_to_vec(dst);
                T::div(&mut d, n);
                dst.copy_from_slice(bytemuck::cast_slice(&d));
            }
        }
    }
    match dtype {
        DType::F32 => go::<f32>(dst, n),
        DType::F64 => go::<f64>(dst, n),
        DType::F16 => go::<f16>(dst, n),
        DType::BF16 => go::<bf16>(dst, n),
        DType::I32 => go::<i32>(dst, n),
        DType::I64 => go::<i64>(dst, n),
    }
}

/// A zeroed byte buffer whose start is 64-byte aligned (scratch space for receives).
pub struct AlignedBuf {
    words: Vec<Line>,
    len: usize,
}

/// One 64-byte cache line (the alignment unit of [`AlignedBuf`]).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        AlignedBuf {
            words: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Grows (never shrinks) to at least `len` bytes and sets the visible length.
    pub fn ensure(&mut self, len: usize) {
        if self.words.len() * 64 < len {
            self.words = vec![Line([0; 64]); len.div_ceil(64)];
        }
        self.len = len;
    }
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.words)[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.words)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_table() {
        let cases: &[(ReduceOp, [f32; 3])] = &[
            (ReduceOp::Sum, [5.0, 1.0, -1.0]),
            (ReduceOp::Avg, [5.0, 1.0, -1.0]),
            (ReduceOp::Max, [3.0, 1.0, 2.0]),
            (ReduceOp::Min, [2.0, 0.0, -3.0]),
        ];
        for (op, want) in cases {
            let mut a = [2.0f32, 1.0, 2.0];
            f32::reduce(&mut a, &[3.0, 0.0, -3.0], *op);
            assert_eq!(&a, want, "{op:?}");
        }
        let mut i = [i32::MAX, 7];
        i32::reduce(&mut i, &[1, -9], ReduceOp::Sum);
        assert_eq!(i, [i32::MIN, -2]);
        let mut h = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        bf16::reduce(
            &mut h,
            &[bf16::from_f32(2.5), bf16::from_f32(4.0)],
            ReduceOp::Sum,
        );
        assert_eq!(h, [bf16::from_f32(4.0), bf16::from_f32(2.0)]);
        let mut d = [7i64, -7];
        i64::div(&mut d, 2);
        assert_eq!(d, [3, -3]);
    }

    /// The one-pass kernels equal the two-pass fold they replace, bit for bit, including the
    /// operand order (f32 max of -0.0 and +0.0 depends on it).
    #[test]
    fn fused_kernels_match_plain_fold() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.731).sin()).collect();
        let mut b: Vec<f32> = (0..37).map(|i| (i as f32 * 1.37).cos()).collect();
        b[3] = -0.0;
        let mut a = a;
        a[3] = 0.0;
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            for first in [true, false] {
                let (x, y) = if first { (&a, &b) } else { (&b, &a) };
                let mut want = x.clone();
                f32::reduce(&mut want, y, op);
                let mut into = vec![9.0f32; 37];
                f32::reduce_into(&mut into, x, y, op);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&into), bits(&want), "{op:?}");
                let mut io = a.clone();
                let mut dst = vec![9.0f32; 37];
                f32::fold_dual(&mut dst, &mut io, &b, first, op);
                assert_eq!(bits(&io), bits(&want), "{op:?} {first}");
                assert_eq!(bits(&dst), bits(&want), "{op:?} {first}");
            }
        }
        let mut io = [bf16::from_f32(1.5), bf16::from_f32(2.0)];
        let mut dst = [bf16::ZERO; 2];
        bf16::fold_dual(
            &mut dst,
            &mut io,
            &[bf16::from_f32(0.5); 2],
            false,
            ReduceOp::Sum,
        );
        assert_eq!(io, [bf16::from_f32(2.0), bf16::from_f32(2.5)]);
        assert_eq!(dst, io);
        let mut raw = [0u8; 9];
        raw[1..9].copy_from_slice(bytemuck::bytes_of(&3i64));
        let mut d = [0u8; 8];
        fold_dual_bytes(
            &mut d,
            &mut raw[1..9],
            &5i64.to_ne_bytes(),
            true,
            DType::I64,
            ReduceOp::Sum,
        );
        assert_eq!(i64::from_ne_bytes(d), 8);
        let mut out = [0u8; 8];
        reduce_into_bytes(
            &mut out,
            &raw[1..9],
            &1i64.to_ne_bytes(),
            DType::I64,
            ReduceOp::Max,
        );
        assert_eq!(i64::from_ne_bytes(out), 8);
    }

    #[test]
    fn half_sum_is_commutative() {
        let xs: Vec<f16> = (0..200)
            .map(|i| f16::from_f32(i as f32 * 0.37 - 20.0))
            .collect();
        let ys: Vec<f16> = (0..200)
            .map(|i| f16::from_f32(i as f32 * -0.11 + 3.3))
            .collect();
        let mut a = xs.clone();
        f16::reduce(&mut a, &ys, ReduceOp::Sum);
        let mut b = ys.clone();
        f16::reduce(&mut b, &xs, ReduceOp::Sum);
        assert_eq!(a, b);
    }

    #[test]
    fn bytes_dispatch_handles_misalignment() {
        let mut raw = [0u8; 17];
        raw[1..9].copy_from_slice(bytemuck::bytes_of(&3.0f64));
        let src = 4.0f64.to_ne_bytes();
        reduce_bytes(&mut raw[1..9], &src, DType::F64, ReduceOp::Sum);
        assert_eq!(f64::from_ne_bytes(raw[1..9].try_into().unwrap()), 7.0);
        let mut b = AlignedBuf::new(10);
        assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
        b.ensure(100);
        assert_eq!(b.len(), 100);
    }
}
