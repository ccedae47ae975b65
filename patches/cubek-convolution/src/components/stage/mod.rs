pub mod bias_stage;
pub mod reader;
