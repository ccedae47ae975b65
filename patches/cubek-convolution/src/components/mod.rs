pub mod global;
pub mod stage;

mod config;
mod error;
mod problem;
mod selection;

pub use config::*;
pub use error::*;
pub use problem::*;
pub use selection::*;
