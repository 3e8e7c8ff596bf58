//! The dense network on ONNX Runtime: a model (from LoadDense) held as a small pool of
//! sessions, swapped whole when a newer version arrives, so a Predict always runs one
//! complete model and never waits for a load.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;
use primus_model::onnx::{DENSE_INPUT, EMBEDDED_INPUT, HEAD_OUTPUT_PREFIX, OUTPUT, WIDE_INPUT};

#[derive(Debug, thiserror::Error)]
pub enum DenseError {
    #[error("ONNX Runtime library {path:?}: {message}")]
    Library { path: String, message: String },
    #[error("ONNX model version {version}: {message}")]
    Model { version: u64, message: String },
    #[error("no dense model loaded yet (serving-sync sends one on its dense interval)")]
    NotLoaded,
    #[error("running the dense model: {0}")]
    Run(String),
}

/// The process's ONNX Runtime environment; the library is loaded once.
fn environment(library: &Path) -> Result<&'static ort::environment::Environment, DenseError> {
    static ENVIRONMENT: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();
    let library_error = |message: String| DenseError::Library {
        path: library.display().to_string(),
        message,
    };
    ENVIRONMENT
        .get_or_init(|| {
            ort::init_from(library)
                .map_err(|e| e.to_string())?
                .with_name("primus-serving")
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| library_error(e.clone()))
}

/// One loaded model version.
pub struct DenseModel {
    pub version: u64,
    sessions: Vec<Mutex<Session>>,
    wide: bool,
    /// Each head's name and output (`head.<name>`), for a model of several heads.
    heads: Vec<(String, String)>,
}

/// What a model predicted for a Predict's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct DensePredictions {
    /// The first head's prediction per row.
    pub probabilities: Vec<f32>,
    /// A model of several heads: each head's name and predictions, in its order.
    pub heads: Vec<(String, Vec<f32>)>,
}

/// Inputs of one Predict, row-major (see primus_model::onnx).
pub struct DenseInputs {
    pub rows: usize,
    pub dense: Vec<f32>,
    pub dense_width: usize,
    pub embedded: Vec<f32>,
    pub embedded_width: usize,
    /// `rows x features` for wide models, else empty.
    pub wide: Vec<f32>,
    pub wide_width: usize,
}

impl DenseModel {
    /// Builds `sessions` sessions of the model (each runs one Predict at a time).
    pub fn load(
        library: &Path,
        version: u64,
        onnx: &[u8],
        sessions: usize,
    ) -> Result<Self, DenseError> {
        let environment = environment(library)?;
        let model_error = |e: ort::Error| DenseError::Model {
            version,
            message: e.to_string(),
        };
        let mut pool = Vec::with_capacity(sessions.max(1));
        for _ in 0..sessions.max(1) {
            let session = Session::builder(environment)
                .map_err(model_error)?
                .with_optimization_level(GraphOptimizationLevel::Level3)
                .map_err(|e| model_error(e.into()))?
                .with_intra_threads(1)
                .map_err(|e| model_error(e.into()))?
                .commit_from_memory(onnx)
                .map_err(model_error)?;
            pool.push(Mutex::new(session));
        }
        let (wide, heads) = pool
            .first()
            .map(|s| {
                let session = s.lock().unwrap_or_else(PoisonError::into_inner);
                let wide = session.inputs().iter().any(|i| i.name() == WIDE_INPUT);
                let heads = (session.outputs().iter())
                    .filter_map(|o| {
                        let head = o.name().strip_prefix(HEAD_OUTPUT_PREFIX)?;
                        Some((head.to_owned(), o.name().to_owned()))
                    })
                    .collect();
                (wide, heads)
            })
            .unwrap_or_default();
        Ok(Self {
            version,
            sessions: pool,
            wide,
            heads,
        })
    }

    /// Probabilities `[rows]` (the first head's predictions) and, for a model of several
    /// heads, each head's, on whichever session is free (blocking: call off the runtime).
    pub fn predict(&self, inputs: DenseInputs) -> Result<DensePredictions, DenseError> {
        let run = |e: ort::Error| DenseError::Run(e.to_string());
        let session = self.free_session();
        let mut session = session.lock().unwrap_or_else(PoisonError::into_inner);
        let dense =
            Tensor::from_array(([inputs.rows, inputs.dense_width], inputs.dense)).map_err(run)?;
        let embedded = Tensor::from_array(([inputs.rows, inputs.embedded_width], inputs.embedded))
            .map_err(run)?;
        let outputs = if self.wide {
            let wide =
                Tensor::from_array(([inputs.rows, inputs.wide_width], inputs.wide)).map_err(run)?;
            session.run(ort::inputs![
                DENSE_INPUT => dense,
                EMBEDDED_INPUT => embedded,
                WIDE_INPUT => wide,
            ])
        } else {
            session.run(ort::inputs![DENSE_INPUT => dense, EMBEDDED_INPUT => embedded])
        }
        .map_err(run)?;
        let values = |name: &str| -> Result<Vec<f32>, DenseError> {
            let (_, values) = (outputs.get(name))
                .ok_or_else(|| DenseError::Run(format!("the model has no output {name:?}")))?
                .try_extract_tensor::<f32>()
                .map_err(run)?;
            Ok(values.to_vec())
        };
        let heads = (self.heads.iter())
            .map(|(head, output)| Ok((head.clone(), values(output)?)))
            .collect::<Result<_, DenseError>>()?;
        Ok(DensePredictions {
            probabilities: values(OUTPUT)?,
            heads,
        })
    }

    fn free_session(&self) -> &Mutex<Session> {
        self.sessions
            .iter()
            .find(|s| s.try_lock().is_ok())
            .unwrap_or(&self.sessions[0])
    }
}

/// The model being served, replaced whole by newer versions.
#[derive(Default)]
pub(super) struct DenseSlot {
    current: RwLock<Option<Arc<DenseModel>>>,
}

impl DenseSlot {
    pub(super) fn get(&self) -> Result<Arc<DenseModel>, DenseError> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(DenseError::NotLoaded)
    }

    pub(super) fn version(&self) -> u64 {
        self.get().map_or(0, |m| m.version)
    }

    /// Installs `model` unless a model as new or newer is already served; returns the
    /// version served afterwards.
    pub(super) fn install(&self, model: DenseModel) -> u64 {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        match current.as_ref() {
            Some(held) if held.version >= model.version => held.version,
            _ => {
                let version = model.version;
                *current = Some(Arc::new(model));
                version
            }
        }
    }
}
