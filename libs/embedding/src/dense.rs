//! Dense parameters held by the PS with a server-side optimizer: named f32 tensors, each
//! updated as one row by the same optimizers as embedding rows. Trainers offer initial
//! values (first writer wins), pull the current values and push gradients.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use primus_spec::job::OptimizerSpec;

use crate::optimizer::Optimizer;
use crate::snapshot::{SnapshotError, open_checked, seal};
use crate::table::first_non_finite;

const MAGIC: &[u8; 4] = b"PRDN";

/// Why dense tensors were refused; nothing changed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DenseError {
    /// A tensor's values do not fill its shape.
    #[error("dense tensor {name:?}: shape {shape:?} holds {want} values, got {got}")]
    Size {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
        /// Values the shape holds.
        want: u64,
        /// Values given.
        got: usize,
    },
    /// The tensor exists with another shape.
    #[error("dense tensor {name:?} exists with shape {stored:?}, not {given:?}")]
    Shape {
        /// The tensor.
        name: String,
        /// The shape it has.
        stored: Vec<u64>,
        /// The shape given.
        given: Vec<u64>,
    },
    /// No tensor of this name.
    #[error("dense tensor {0:?} does not exist (initialise it first)")]
    Unknown(String),
    /// A gradient value is NaN or infinite.
    #[error("dense tensor {name:?}: value {index} is not finite")]
    NonFinite {
        /// The tensor.
        name: String,
        /// The value's position.
        index: usize,
    },
}

/// A tensor's current values.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseValues {
    /// The tensor's name (the model's parameter name).
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its values, row-major.
    pub values: Vec<f32>,
}

struct Tensor {
    shape: Vec<u64>,
    weights: Vec<f32>,
    state: Vec<f32>,
}

struct Inner {
    tensors: BTreeMap<String, Tensor>,
    version: u64,
}

/// Named dense tensors with their optimizer state, updated by a server-side optimizer.
pub struct DenseStore {
    spec: OptimizerSpec,
    optimizer: Optimizer,
    inner: RwLock<Inner>,
}

impl DenseStore {
    /// An empty store whose pushes apply `optimizer`.
    pub fn new(optimizer: &OptimizerSpec) -> Self {
        Self {
            spec: optimizer.clone(),
            optimizer: Optimizer::from_spec(optimizer),
            inner: RwLock::new(Inner {
                tensors: BTreeMap::new(),
                version: 0,
            }),
        }
    }

    /// Creates the tensors that do not exist yet; returns the names created. A tensor that
    /// exists keeps its values (the first trainer's initialisation wins) but must have the
    /// same shape. Nothing is created unless every tensor is valid.
    pub fn init(&self, tensors: &[DenseValues]) -> Result<Vec<String>, DenseError> {
        for tensor in tensors {
            check_size(&tensor.name, &tensor.shape, tensor.values.len())?;
            check_finite(&tensor.name, &tensor.values)?;
        }
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        for tensor in tensors {
            if let Some(stored) = inner.tensors.get(&tensor.name)
                && stored.shape != tensor.shape
            {
                return Err(DenseError::Shape {
                    name: tensor.name.clone(),
                    stored: stored.shape.clone(),
                    given: tensor.shape.clone(),
                });
            }
        }
        let mut created = Vec::new();
        for tensor in tensors {
            if inner.tensors.contains_key(&tensor.name) {
                continue;
            }
            let mut state = vec![0.0; self.optimizer.state_len(tensor.values.len())];
            self.optimizer.init_state(&tensor.values, &mut state);
            inner.tensors.insert(
                tensor.name.clone(),
                Tensor {
                    shape: tensor.shape.clone(),
                    weights: tensor.values.clone(),
                    state,
                },
            );
            created.push(tensor.name.clone());
        }
        if !created.is_empty() {
            inner.version += 1;
        }
        Ok(created)
    }

    /// The optimizer pushes apply.
    pub fn optimizer(&self) -> &OptimizerSpec {
        &self.spec
    }

    /// `names` (every tensor when empty) with their optimizer state in
    /// [`DenseStore::encode`]'s form, and the version they are at: what a copy that applies
    /// the same pushes starts from.
    pub fn export(&self, names: &[String]) -> Result<(Vec<u8>, u64), DenseError> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(unknown) = names.iter().find(|n| !inner.tensors.contains_key(*n)) {
            return Err(DenseError::Unknown(unknown.clone()));
        }
        let bytes = encode_kept(&inner, |name| {
            names.is_empty() || names.iter().any(|n| n == name)
        });
        Ok((bytes, inner.version))
    }

    /// Current values of `names` (every tensor when empty) and the version they are at.
    pub fn pull(&self, names: &[String]) -> Result<(Vec<DenseValues>, u64), DenseError> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        let values = |(name, tensor): (&String, &Tensor)| DenseValues {
            name: name.clone(),
            shape: tensor.shape.clone(),
            values: tensor.weights.clone(),
        };
        let pulled = if names.is_empty() {
            inner.tensors.iter().map(values).collect()
        } else {
            names
                .iter()
                .map(|name| {
                    inner
                        .tensors
                        .get_key_value(name)
                        .map(values)
                        .ok_or_else(|| DenseError::Unknown(name.clone()))
                })
                .collect::<Result<_, _>>()?
        };
        Ok((pulled, inner.version))
    }

    /// The version the tensors are at (one more per push).
    pub fn version(&self) -> u64 {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .version
    }

    /// Applies every gradient with the optimizer, all or nothing; returns the new version.
    pub fn push(&self, grads: &[DenseValues]) -> Result<u64, DenseError> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        for grad in grads {
            let tensor = inner
                .tensors
                .get(&grad.name)
                .ok_or_else(|| DenseError::Unknown(grad.name.clone()))?;
            check_size(&grad.name, &tensor.shape, grad.values.len())?;
            check_finite(&grad.name, &grad.values)?;
        }
        for grad in grads {
            if let Some(tensor) = inner.tensors.get_mut(&grad.name) {
                self.optimizer
                    .apply(&mut tensor.weights, &mut tensor.state, &grad.values);
            }
        }
        inner.version += 1;
        Ok(inner.version)
    }
}

impl DenseStore {
    /// Bytes of the weights and optimizer state held.
    pub fn bytes(&self) -> u64 {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner
            .tensors
            .values()
            .map(|t| ((t.weights.len() + t.state.len()) * 4) as u64)
            .sum()
    }

    /// Every tensor with its optimizer state, in a checksummed binary form (magic `PRDN`,
    /// format, version, count; per tensor name, shape, weights, state; CRC32).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_where(|_| true)
    }

    /// The tensors whose name `keep` accepts, in [`DenseStore::encode`]'s form.
    pub fn encode_where(&self, keep: impl Fn(&str) -> bool) -> Vec<u8> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        encode_kept(&inner, keep)
    }

    /// Replaces every tensor with those in `bytes` (from [`DenseStore::encode`]); nothing
    /// changes unless all of it decodes and fits this store's optimizer. Returns the count.
    pub fn restore(&self, bytes: &[u8]) -> Result<usize, SnapshotError> {
        self.restore_where(bytes, |_| true)
    }

    /// Replaces every tensor with those in `bytes` whose name `keep` accepts.
    pub fn restore_where(
        &self,
        bytes: &[u8],
        keep: impl Fn(&str) -> bool,
    ) -> Result<usize, SnapshotError> {
        let (version, tensors) = self.decode_kept(bytes, keep)?;
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let restored = tensors.len();
        inner.tensors = tensors;
        inner.version = inner.version.max(version);
        Ok(restored)
    }

    /// Adds the tensors in `bytes` (from [`DenseStore::encode_where`]) whose name `keep`
    /// accepts, with their optimizer state, replacing those of the same name and keeping the
    /// others: tensors moving here from another PS process. Nothing changes unless all of it
    /// decodes. Returns how many were added.
    pub fn merge_where(
        &self,
        bytes: &[u8],
        keep: impl Fn(&str) -> bool,
    ) -> Result<usize, SnapshotError> {
        let (version, tensors) = self.decode_kept(bytes, keep)?;
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let merged = tensors.len();
        inner.tensors.extend(tensors);
        inner.version = inner.version.max(version) + 1;
        Ok(merged)
    }

    /// Drops the tensors whose name `keep` rejects (they moved to another PS process).
    /// Returns how many went.
    pub fn forget(&self, keep: impl Fn(&str) -> bool) -> usize {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let before = inner.tensors.len();
        inner.tensors.retain(|name, _| keep(name));
        before - inner.tensors.len()
    }

    /// [`Self::decode`], keeping the tensors whose name `keep` accepts.
    fn decode_kept(
        &self,
        bytes: &[u8],
        keep: impl Fn(&str) -> bool,
    ) -> Result<(u64, BTreeMap<String, Tensor>), SnapshotError> {
        let (version, mut tensors) = self.decode(bytes)?;
        tensors.retain(|name, _| keep(name));
        Ok((version, tensors))
    }

    /// The version and tensors in `bytes`, checked against this store's optimizer.
    fn decode(&self, bytes: &[u8]) -> Result<(u64, BTreeMap<String, Tensor>), SnapshotError> {
        let mut reader = open_checked(bytes, MAGIC)?;
        let truncated = || SnapshotError::Truncated(bytes.len());
        let version = reader.u64()?;
        let count = reader.u64()?;
        let mut tensors = BTreeMap::new();
        for _ in 0..count {
            let name_len = usize::try_from(reader.u64()?).map_err(|_| truncated())?;
            let name =
                String::from_utf8(reader.take(name_len)?.to_vec()).map_err(|_| truncated())?;
            let dims = reader.u64()?;
            let shape = (0..dims)
                .map(|_| reader.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let floats =
                |reader: &mut crate::snapshot::Reader<'_>| -> Result<Vec<f32>, SnapshotError> {
                    let n = usize::try_from(reader.u64()?).map_err(|_| truncated())?;
                    if n.saturating_mul(4) > bytes.len() {
                        return Err(truncated());
                    }
                    (0..n)
                        .map(|_| reader.array().map(f32::from_le_bytes))
                        .collect()
                };
            let weights = floats(&mut reader)?;
            let state = floats(&mut reader)?;
            let want = self.optimizer.state_len(weights.len());
            if state.len() != want {
                return Err(SnapshotError::DenseState {
                    name,
                    got: state.len(),
                    want,
                });
            }
            tensors.insert(
                name,
                Tensor {
                    shape,
                    weights,
                    state,
                },
            );
        }
        if !reader.done() {
            return Err(truncated());
        }
        Ok((version, tensors))
    }
}

fn check_size(name: &str, shape: &[u64], got: usize) -> Result<(), DenseError> {
    let want = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
    match want {
        Some(want) if want == got as u64 => Ok(()),
        _ => Err(DenseError::Size {
            name: name.to_owned(),
            shape: shape.to_vec(),
            want: want.unwrap_or(u64::MAX),
            got,
        }),
    }
}

fn check_finite(name: &str, values: &[f32]) -> Result<(), DenseError> {
    match first_non_finite(values) {
        Some(index) => Err(DenseError::NonFinite {
            name: name.to_owned(),
            index,
        }),
        None => Ok(()),
    }
}

/// The tensors of `inner` whose name `keep` accepts, in [`DenseStore::encode`]'s form.
fn encode_kept(inner: &Inner, keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let kept: Vec<(&String, &Tensor)> = inner
        .tensors
        .iter()
        .filter(|(name, _)| keep(name))
        .collect();
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&inner.version.to_le_bytes());
    out.extend_from_slice(&(kept.len() as u64).to_le_bytes());
    for (name, tensor) in kept {
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(tensor.shape.len() as u64).to_le_bytes());
        for d in &tensor.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        for floats in [&tensor.weights, &tensor.state] {
            out.extend_from_slice(&(floats.len() as u64).to_le_bytes());
            for v in floats {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    seal(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: &[u64], values: &[f32]) -> DenseValues {
        DenseValues {
            name: name.into(),
            shape: shape.to_vec(),
            values: values.to_vec(),
        }
    }

    #[test]
    fn first_init_wins_and_sgd_pushes_apply() {
        let store = DenseStore::new(&OptimizerSpec::Sgd { learning_rate: 0.5 });
        let created = store
            .init(&[tensor("w", &[2, 2], &[1.0, 2.0, 3.0, 4.0])])
            .expect("init");
        assert_eq!(created, vec!["w".to_owned()]);
        let again = store
            .init(&[tensor("w", &[2, 2], &[9.0; 4])])
            .expect("second init");
        assert!(again.is_empty(), "existing values kept");
        let version = store
            .push(&[tensor("w", &[2, 2], &[2.0, 2.0, 2.0, 2.0])])
            .expect("push");
        let (pulled, at) = store.pull(&["w".into()]).expect("pull");
        assert_eq!(at, version);
        assert_eq!(pulled[0].values, vec![0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn encode_restore_round_trip_keeps_optimizer_state() {
        let adam = OptimizerSpec::Adam {
            learning_rate: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        };
        let (a, b) = (DenseStore::new(&adam), DenseStore::new(&adam));
        let w = tensor("w", &[3], &[0.1, 0.2, 0.3]);
        a.init(std::slice::from_ref(&w)).expect("init");
        a.push(&[tensor("w", &[3], &[1.0, -1.0, 0.5])])
            .expect("push");
        assert_eq!(b.restore(&a.encode()).expect("restore"), 1);
        let grad = tensor("w", &[3], &[0.3, 0.3, 0.3]);
        a.push(std::slice::from_ref(&grad)).expect("push");
        b.push(&[grad]).expect("push");
        assert_eq!(a.pull(&[]).expect("pull"), b.pull(&[]).expect("pull"));
        let mut damaged = a.encode();
        damaged[20] ^= 1;
        assert!(matches!(
            b.restore(&damaged),
            Err(SnapshotError::Checksum { .. })
        ));
        let sgd = DenseStore::new(&OptimizerSpec::Sgd { learning_rate: 0.1 });
        assert!(matches!(
            sgd.restore(&a.encode()),
            Err(SnapshotError::DenseState { .. })
        ));
    }

    #[test]
    fn bad_tensors_change_nothing() {
        let store = DenseStore::new(&OptimizerSpec::Sgd { learning_rate: 0.5 });
        store.init(&[tensor("w", &[2], &[1.0, 2.0])]).expect("init");
        let errors = [
            store.init(&[tensor("v", &[3], &[1.0])]).expect_err("size"),
            store
                .init(&[tensor("w", &[1, 2], &[1.0, 2.0])])
                .expect_err("shape"),
            store
                .push(&[tensor("nope", &[2], &[1.0, 1.0])])
                .expect_err("unknown"),
            store
                .push(&[tensor("w", &[2], &[1.0, f32::INFINITY])])
                .expect_err("finite"),
        ];
        assert!(matches!(errors[0], DenseError::Size { .. }));
        assert!(matches!(errors[1], DenseError::Shape { .. }));
        assert!(matches!(errors[2], DenseError::Unknown(_)));
        assert!(matches!(errors[3], DenseError::NonFinite { index: 1, .. }));
        let (pulled, version) = store.pull(&[]).expect("pull");
        assert_eq!(pulled, vec![tensor("w", &[2], &[1.0, 2.0])]);
        assert_eq!(version, 1);
    }
}
