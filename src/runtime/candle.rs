//! candle integration: all-reduce a `Var` set's gradients in one call through the DDP reducer.
//!
//! candle has no per-parameter autograd hooks (`Tensor::backward` returns the whole
//! `GradStore` at the end), so this uses [`Reducer::sync_all`]: gradients are copied to host
//! buckets in reverse parameter order, each bucket goes on the wire as soon as it is filled, and
//! the averaged values are put back into the `GradStore` for `Optimizer::step`.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::ddp::{Reducer, ReducerOptions};
use super::error::{Result, RuntimeError};
use super::group::ProcessGroup;
use super::shm::fnv1a;

fn candle_err(rank: usize, e: candle_core::Error) -> RuntimeError {
    RuntimeError::Invalid {
        rank,
        op: "candle",
        msg: e.to_string(),
    }
}

/// A variable's values as host f32 (row-major).
pub fn var_to_vec(v: &Var, rank: usize) -> Result<Vec<f32>> {
    v.as_tensor()
        .flatten_all()
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| candle_err(rank, e))
}

/// FNV-1a hash of every variable's bytes, in order (bit-identity checks across ranks).
pub fn vars_hash(vars: &[Var], rank: usize) -> Result<u64> {
    let mut all = Vec::new();
    for v in vars {
        all.extend_from_slice(bytemuck::cast_slice(&var_to_vec(v, rank)?));
    }
    Ok(fnv1a(&all))
}

/// Data-parallel wrapper around a fixed, ordered set of f32 variables.
pub struct CandleDdp {
    reducer: Reducer<f32>,
    vars: Vec<Var>,
    rank: usize,
}

impl CandleDdp {
    /// Registers `vars` (same order on every rank) and copies rank 0's values to every rank.
    pub fn new(group: Arc<ProcessGroup>, vars: Vec<Var>, opts: ReducerOptions) -> Result<Self> {
        let rank = group.rank();
        let numels: Vec<usize> = vars.iter().map(|v| v.elem_count()).collect();
        let reducer = Reducer::<f32>::new(group, &numels, opts)?;
        let mut host: Vec<Vec<f32>> = vars
            .iter()
            .map(|v| var_to_vec(v, rank))
            .collect::<Result<_>>()?;
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|h| h.as_mut_slice()).collect();
            reducer.broadcast_params(&mut views)?;
        }
        for (v, h) in vars.iter().zip(host) {
            let t = Tensor::from_vec(h, v.shape(), v.device()).map_err(|e| candle_err(rank, e))?;
            v.set(&t).map_err(|e| candle_err(rank, e))?;
        }
        Ok(CandleDdp {
            reducer,
            vars,
            rank,
        })
    }

    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// `no_sync()`: while false, gradients accumulate locally in the reducer.
    pub fn set_require_sync(&mut self, on: bool) {
        self.reducer.set_require_sync(on);
    }

    /// Replaces every variable's gradient in `grads` by its mean over all ranks (a variable with
    /// no gradient counts as zeros).
    pub fn sync_grads(&mut self, grads: &mut GradStore) -> Result<()> {
        let rank = self.rank;
        let mut host: Vec<Vec<f32>> = Vec::with_capacity(self.vars.len());
        for v in &self.vars {
            let g = match grads.get(v.as_tensor()) {
                Some(g) => g
                    .flatten_all()
                    .and_then(|t| t.to_dtype(candle_core::DType::F32))
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| candle_err(rank, e))?,
                None => vec![0.0; v.elem_count()],
            };
            host.push(g);
        }
        {
            let mut views: Vec<&mut [f32]> = host.iter_mut().map(|h| h.as_mut_slice()).collect();
            self.reducer.sync_all(&mut views)?;
        }
        for (v, h) in self.vars.iter().zip(host) {
            let t = Tensor::from_vec(h, v.shape(), v.device())
                .and_then(|t| t.to_dtype(v.dtype()))
                .map_err(|e| candle_err(rank, e))?;
            grads.insert(v.as_tensor(), t);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::run_world;
    use crate::runtime::BackendChoice;
    use candle_core::Device;
    use std::time::Duration;

    #[test]
    fn grads_are_averaged_and_params_broadcast() {
        let outs = run_world(2, BackendChoice::Tcp, 4096, Duration::from_secs(60), |pg| {
            let r = pg.rank() as f32;
            let dev = Device::Cpu;
            let w = Var::from_vec(vec![r; 4], (2, 2), &dev).unwrap();
            let b = Var::from_vec(vec![r + 1.0; 2], 2, &dev).unwrap();
            let mut ddp = CandleDdp::new(
                Arc::new(pg),
                vec![w.clone(), b.clone()],
                ReducerOptions::default(),
            )
            .unwrap();
            let x = Tensor::from_vec(vec![1.0f32, 2.0], (1, 2), &dev).unwrap();
            let scale = Tensor::new(r + 1.0, &dev).unwrap();
            let y = x
                .matmul(w.as_tensor())
                .unwrap()
                .broadcast_add(b.as_tensor())
                .unwrap()
                .sum_all()
                .unwrap()
                .broadcast_mul(&scale)
                .unwrap();
            let mut g = y.backward().unwrap();
            ddp.sync_grads(&mut g).unwrap();
            let gw = g
                .get(w.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let gb = g.get(b.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
            (
                var_to_vec(&w, 0).unwrap(),
                gw,
                gb,
                vars_hash(ddp.vars(), 0).unwrap(),
            )
        });
        for (wv, gw, gb, h) in &outs {
            assert_eq!(wv, &vec![0.0; 4], "rank 0's params everywhere");
            // d/dW of scale * sum(xW + b) = scale * x^T 1; mean of scale over ranks = 1.5.
            assert_eq!(gw, &vec![1.5, 1.5, 3.0, 3.0]);
            assert_eq!(gb, &vec![1.5, 1.5]);
            assert_eq!(*h, outs[0].3);
        }
    }
}
