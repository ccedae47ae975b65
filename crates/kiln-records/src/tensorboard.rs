//! TensorBoard's event files, as TensorBoard reads them (`tensorboard --logdir runs`): records
//! of a little-endian length, its masked CRC-32C, a protobuf `Event` and the event's masked
//! CRC-32C. The messages are the few fields of TensorBoard's `event.proto` and `summary.proto`
//! that kiln writes (prost encodes them); the checksums are the `crc32c` crate's.
//!
//! A run writes one file, `tensorboard/events.out.tfevents.<seconds>.kiln`. A resumed run first
//! cuts it back to the step it resumes from, so that TensorBoard sees no step twice.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// `tensorflow.Event`: one record of the file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TfEvent {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<TfSummary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TfSummary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<TfValue>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or a tensor with its plugin.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TfValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `tensorflow.TensorProto`, for a string scalar (the text plugin's data).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `DT_STRING` is 7.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto`: no dimensions, a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShape {}

/// `tensorflow.SummaryMetadata`: which TensorBoard plugin shows the value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

const DT_STRING: i32 = 7;

/// TensorBoard's checksum: CRC-32C, rotated and offset so that a CRC of data holding CRCs
/// stays informative.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// An open event file that scalars and texts are appended to.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir`, or with `resume_at`, the existing one (if any) cut back to the
    /// events at or before that step and continued.
    pub fn open(dir: &Path, resume_at: Option<i64>) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let existing = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains("tfevents"));
        if let (Some(step), Some(path)) = (resume_at, existing) {
            // Records written after the checkpoint are written again by the resumed run; a
            // damaged tail (a kill mid-record) is dropped with them.
            let kept: Vec<TfEvent> = read_events(&path)
                .into_iter()
                .take_while(Result::is_ok)
                .filter_map(Result::ok)
                .filter(|e| e.step <= step)
                .collect();
            // Not named `*tfevents*`: a kill mid-rewrite must not leave a second file that
            // TensorBoard would read.
            let partial = dir.join(".events.rewrite");
            let mut writer = EventWriter {
                file: BufWriter::new(File::create(&partial)?),
                path: partial.clone(),
            };
            for event in &kept {
                writer.write(event)?;
            }
            writer.flush()?;
            std::fs::rename(&partial, &path)?;
            let file = std::fs::OpenOptions::new().append(true).open(&path)?;
            return Ok(EventWriter {
                file: BufWriter::new(file),
                path,
            });
        }
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let path = dir.join(format!("events.out.tfevents.{seconds}.kiln"));
        let mut writer = EventWriter {
            file: BufWriter::new(File::create(&path)?),
            path,
        };
        writer.write(&TfEvent {
            wall_time: now(),
            file_version: Some("brain.Event:2".into()),
            ..TfEvent::default()
        })?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A point of the scalar plot `tag`.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64) -> std::io::Result<()> {
        self.summary(
            step,
            TfValue {
                tag: tag.into(),
                simple_value: Some(value as f32),
                ..TfValue::default()
            },
        )
    }

    /// A text shown by TensorBoard's text plugin (Markdown).
    pub fn text(&mut self, tag: &str, step: i64, text: &str) -> std::io::Result<()> {
        self.summary(
            step,
            TfValue {
                tag: tag.into(),
                tensor: Some(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShape {}),
                    string_val: vec![text.as_bytes().to_vec()],
                }),
                metadata: Some(SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "text".into(),
                    }),
                }),
                ..TfValue::default()
            },
        )
    }

    fn summary(&mut self, step: i64, value: TfValue) -> std::io::Result<()> {
        self.write(&TfEvent {
            wall_time: now(),
            step,
            summary: Some(TfSummary { value: vec![value] }),
            ..TfEvent::default()
        })
    }

    fn write(&mut self, event: &TfEvent) -> std::io::Result<()> {
        let data = prost::Message::encode_to_vec(event);
        let length = (data.len() as u64).to_le_bytes();
        self.file.write_all(&length)?;
        self.file.write_all(&masked_crc(&length).to_le_bytes())?;
        self.file.write_all(&data)?;
        self.file.write_all(&masked_crc(&data).to_le_bytes())
    }

    /// Everything so far on disk, so that TensorBoard (and a kill) sees whole epochs.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_data()
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The events of the file at `path`, each checked against both of its CRCs; reading stops at
/// the first damaged or incomplete record, which is returned as an error.
pub fn read_events(path: &Path) -> Vec<Result<TfEvent, String>> {
    let mut bytes = Vec::new();
    if let Err(e) = File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)) {
        return vec![Err(e.to_string())];
    }
    let mut events = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let event = next_record(&mut rest);
        let damaged = event.is_err();
        events.push(event);
        if damaged {
            break;
        }
    }
    events
}

fn next_record(rest: &mut &[u8]) -> Result<TfEvent, String> {
    let take = |rest: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
        if rest.len() < n {
            return Err("the file ends inside a record".into());
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head.to_vec())
    };
    let u32_of = |b: Vec<u8>| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let length = take(rest, 8)?;
    if u32_of(take(rest, 4)?) != masked_crc(&length) {
        return Err("a record's length fails its checksum".into());
    }
    let length = u64::from_le_bytes(length.try_into().expect("eight bytes"));
    let data = take(rest, usize::try_from(length).map_err(|e| e.to_string())?)?;
    if u32_of(take(rest, 4)?) != masked_crc(&data) {
        return Err("a record fails its checksum".into());
    }
    <TfEvent as prost::Message>::decode(data.as_slice()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C of 32 zero bytes is 0x8a9136aa (RFC 3720's example); TensorBoard's own
    /// `record_writer.masked_crc32c(bytes(32))` gives 0x0fd7fffa.
    #[test]
    fn the_checksum_is_crc32c_masked_as_tensorboard_masks_it() {
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(masked_crc(&[0u8; 32]), 0x0fd7_fffa);
    }

    #[test]
    fn events_read_back_and_a_resume_cuts_the_file_at_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::open(dir.path(), None).unwrap();
        for step in 1..=6 {
            writer
                .scalar("train/loss", step, 1.0 / step as f64)
                .unwrap();
        }
        writer.text("config", 0, "lr = 0.1").unwrap();
        writer.flush().unwrap();
        let path = writer.path().to_path_buf();
        drop(writer);
        let events: Vec<TfEvent> = read_events(&path).into_iter().map(Result::unwrap).collect();
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events.len(), 8);
        let value = &events[3].summary.as_ref().unwrap().value[0];
        assert_eq!((events[3].step, value.tag.as_str()), (3, "train/loss"));
        assert_eq!(value.simple_value, Some(1.0 / 3.0));

        // A kill mid-record leaves a torn tail; resuming from step 4 keeps steps up to 4.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[9, 0, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_events(&path).last().unwrap().is_err());
        let mut resumed = EventWriter::open(dir.path(), Some(4)).unwrap();
        resumed.scalar("train/loss", 5, 0.5).unwrap();
        resumed.flush().unwrap();
        let steps: Vec<i64> = read_events(&path)
            .into_iter()
            .map(|e| e.unwrap().step)
            .collect();
        assert_eq!(steps, [0, 1, 2, 3, 4, 0, 5]);
        // A flipped byte fails the record's checksum.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_events(&path).last().unwrap().is_err());
    }
}
