pub mod args;
pub mod layout;
pub mod read;
