mod blueprint;

pub use blueprint::*;
