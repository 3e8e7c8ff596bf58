//! Layered settings for every Primus service, and the typed settings themselves.
//!
//! Layers, later wins: the service's built-in defaults, then a YAML, TOML or JSON
//! file given by `--config`, then `PRIMUS_<SECTION>__<KEY>` environment variables
//! (`PRIMUS_SERVER__GRPC_ADDR=0.0.0.0:7000` sets `server.grpc_addr`). A wrong type or an
//! unknown key fails the load with an error naming the key and the layer it came from.

mod load;
mod settings;

pub use load::{ConfigError, ENV_PREFIX, load, load_from_process, to_toml};
pub use settings::*;
