//! Everything Primus says over NATS.
//!
//! - [`subjects`]: every subject name, built in one place (no service formats one by hand).
//! - [`Bus`]: a connection with retry at start, typed publish/subscribe of prost messages
//!   that carry W3C trace context in NATS headers, and JetStream stream/consumer helpers.

#![warn(missing_docs)]

mod bus;
pub mod jetstream;
pub mod subjects;

pub use bus::{Bus, BusError, Received, Subscription};
pub use subjects::Subjects;
