//! CIFAR in both formats, on miniature files: the Python format as written by Python's pickle
//! and numpy (`fixtures/make_cifar_fixtures.py`) and as the official Python 2 files encode it
//! (written here opcode by opcode), the binary format written here, corrupt files, and the
//! download path against a loopback server.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use kiln_data::cifar::{self, ArchiveSource, Cifar};
use kiln_data::{DataError, Dataset};

/// The pixel pattern of the fixtures (see `make_cifar_fixtures.py`).
fn pixel(image: usize, c: usize, y: usize, x: usize) -> u8 {
    ((image * 31 + c * 101 + y * 7 + x * 3) % 256) as u8
}

/// One image in CIFAR's stored layout: 1024 red, 1024 green, 1024 blue.
fn stored(image: usize) -> Vec<u8> {
    (0..3)
        .flat_map(|c| (0..32).flat_map(move |y| (0..32).map(move |x| pixel(image, c, y, x))))
        .collect()
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Checks that image `i` of `set` is fixture image `source` with label `label`, in HWC.
fn assert_image(set: &dyn Dataset, i: usize, source: usize, label: usize) {
    let image = set.image(i).unwrap();
    assert_eq!(image.dimensions(), (32, 32));
    for (x, y) in [(0, 0), (31, 0), (5, 17), (31, 31)] {
        let expected = [0, 1, 2].map(|c| pixel(source, c, y as usize, x as usize));
        assert_eq!(image.get_pixel(x, y).0, expected, "image {i} at ({x}, {y})");
    }
    assert_eq!(set.label(i), label);
}

#[test]
fn torchvision_python_folders_are_read_as_they_are() {
    let sets = cifar::open(Cifar::Cifar10, &fixtures(), false).unwrap();
    assert_eq!((sets.train.len(), sets.test.len()), (10, 3));
    assert_eq!(sets.train.classes()[9], "truck");
    for i in 0..10 {
        assert_image(&sets.train, i, i, i % 10);
    }
    assert_image(&sets.test, 2, 102, 7);

    let sets = cifar::open(Cifar::Cifar100, &fixtures(), false).unwrap();
    assert_eq!((sets.train.len(), sets.test.len()), (4, 1));
    assert_eq!(sets.train.classes()[42], "fine42");
    assert_image(&sets.train, 0, 0, 99);
    assert_image(&sets.train, 2, 2, 42);
    assert_image(&sets.test, 0, 50, 3);
}

/// A pickle as Python 2's cPickle wrote the official batches: byte-string opcodes, a numpy
/// array through `_reconstruct` and `BUILD`.
fn python2_batch(labels: &[u8], first_image: usize) -> Vec<u8> {
    fn short(out: &mut Vec<u8>, s: &[u8]) {
        out.push(b'U');
        out.push(s.len() as u8);
        out.extend_from_slice(s);
    }
    let mut out = vec![0x80, 2, b'}', b'('];
    short(&mut out, b"labels");
    out.extend_from_slice(b"]("); // EMPTY_LIST, MARK
    for &label in labels {
        out.extend_from_slice(&[b'K', label]);
    }
    out.push(b'e'); // APPENDS
    short(&mut out, b"data");
    out.extend_from_slice(b"cnumpy.core.multiarray\n_reconstruct\n");
    out.extend_from_slice(b"cnumpy\nndarray\n");
    out.extend_from_slice(&[b'K', 0, 0x85]);
    short(&mut out, b"b");
    out.extend_from_slice(&[0x87, b'R', b'(', b'K', 1]);
    out.push(b'J');
    out.extend_from_slice(&(labels.len() as i32).to_le_bytes());
    out.extend_from_slice(b"M\x00\x0c\x86"); // BININT2 3072, TUPLE2
    out.extend_from_slice(b"cnumpy\ndtype\n");
    short(&mut out, b"u1");
    out.extend_from_slice(&[b'K', 0, b'K', 1, 0x87, b'R', b'(', b'K', 3]);
    short(&mut out, b"|");
    out.extend_from_slice(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb");
    out.push(0x89); // NEWFALSE
    let data: Vec<u8> = (0..labels.len())
        .flat_map(|i| stored(first_image + i))
        .collect();
    out.push(b'T');
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(b"tbu.");
    out
}

#[test]
fn official_python_2_pickles_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("cifar-10-batches-py");
    copy_dir(&fixtures().join("cifar-10-batches-py"), &folder);
    std::fs::write(folder.join("test_batch"), python2_batch(&[4, 0, 6, 1], 200)).unwrap();
    let sets = cifar::open(Cifar::Cifar10, dir.path(), false).unwrap();
    assert_eq!(sets.test.len(), 4);
    assert_image(&sets.test, 0, 200, 4);
    assert_image(&sets.test, 3, 203, 1);
}

fn write_binary(folder: &Path, which: Cifar) {
    std::fs::create_dir_all(folder).unwrap();
    let record = |image: usize, label: u8| -> Vec<u8> {
        let mut r = match which {
            Cifar::Cifar10 => vec![label],
            Cifar::Cifar100 => vec![label / 5, label],
        };
        r.extend(stored(image));
        r
    };
    let (train, test, names): (Vec<String>, &str, &str) = match which {
        Cifar::Cifar10 => (
            (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            "test_batch.bin",
            "batches.meta.txt",
        ),
        Cifar::Cifar100 => (vec!["train.bin".into()], "test.bin", "fine_label_names.txt"),
    };
    for (b, name) in train.iter().enumerate() {
        let bytes = [record(2 * b, 3), record(2 * b + 1, 1)].concat();
        std::fs::write(folder.join(name), bytes).unwrap();
    }
    std::fs::write(folder.join(test), record(77, 2)).unwrap();
    let count = if which == Cifar::Cifar10 { 10 } else { 100 };
    let lines: String = (0..count).map(|i| format!("class{i}\n")).collect();
    std::fs::write(folder.join(names), lines + "\n").unwrap();
}

#[test]
fn binary_folders_are_read() {
    let dir = tempfile::tempdir().unwrap();
    write_binary(&dir.path().join("cifar-10-batches-bin"), Cifar::Cifar10);
    let sets = cifar::open(Cifar::Cifar10, dir.path(), false).unwrap();
    assert_eq!((sets.train.len(), sets.test.len()), (10, 1));
    assert_eq!(sets.train.classes().len(), 10);
    assert_image(&sets.train, 0, 0, 3);
    assert_image(&sets.train, 9, 9, 1);
    assert_image(&sets.test, 0, 77, 2);

    write_binary(&dir.path().join("cifar-100-binary"), Cifar::Cifar100);
    let sets = cifar::open(Cifar::Cifar100, dir.path(), false).unwrap();
    assert_eq!(sets.train.len(), 2);
    assert_image(&sets.train, 1, 1, 1);
    // The root may also be the format folder itself.
    let direct = cifar::open(Cifar::Cifar100, &dir.path().join("cifar-100-binary"), false);
    assert_eq!(direct.unwrap().test.len(), 1);
}

fn error_of(result: Result<cifar::CifarSplits, DataError>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_or_corrupt_batches_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("cifar-10-batches-py");
    copy_dir(&fixtures().join("cifar-10-batches-py"), &folder);
    let batch = folder.join("data_batch_3");
    let bytes = std::fs::read(&batch).unwrap();
    for cut in [bytes.len() - 1, bytes.len() / 2, 10] {
        std::fs::write(&batch, &bytes[..cut]).unwrap();
        let err = error_of(cifar::open(Cifar::Cifar10, dir.path(), false));
        assert!(err.contains(&*batch.to_string_lossy()), "{err}");
        assert!(err.contains("truncated or corrupt"), "{err}");
    }
    std::fs::write(&batch, b"this is not a pickle").unwrap();
    let err = error_of(cifar::open(Cifar::Cifar10, dir.path(), false));
    assert!(err.contains("data_batch_3"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("cifar-10-batches-bin");
    write_binary(&folder, Cifar::Cifar10);
    let batch = folder.join("data_batch_2.bin");
    let bytes = std::fs::read(&batch).unwrap();
    std::fs::write(&batch, &bytes[..bytes.len() - 100]).unwrap();
    let err = error_of(cifar::open(Cifar::Cifar10, dir.path(), false));
    assert!(
        err.contains("data_batch_2.bin") && err.contains("truncated"),
        "{err}"
    );
    std::fs::write(&batch, [vec![12u8], stored(0)].concat()).unwrap();
    let err = error_of(cifar::open(Cifar::Cifar10, dir.path(), false));
    assert!(err.contains("label 12"), "{err}");
}

#[test]
fn missing_data_without_download_says_what_to_put_where() {
    let dir = tempfile::tempdir().unwrap();
    let err = error_of(cifar::open(Cifar::Cifar10, dir.path(), false));
    assert!(err.contains("cifar-10-batches-py"), "{err}");
    assert!(
        err.contains("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
        "{err}"
    );
    assert!(err.contains("download = true"), "{err}");
}

/// Serves `body` to every request on loopback; returns the URL.
fn serve(body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/cifar-10-python.tar.gz",
        listener.local_addr().unwrap()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let header = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(header.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    url
}

fn archive_of_fixture() -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all(
        "cifar-10-batches-py",
        fixtures().join("cifar-10-batches-py"),
    )
    .unwrap();
    tar.into_inner().unwrap().finish().unwrap()
}

#[test]
fn downloads_are_checked_extracted_and_reused() {
    let archive = archive_of_fixture();
    let sha256 = kiln_download_sha256(&archive);
    let url = serve(archive);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");

    let wrong = ArchiveSource {
        url: url.clone(),
        sha256: "00".repeat(32),
    };
    let err = error_of(cifar::open_from(Cifar::Cifar10, &root, true, &wrong));
    assert!(err.contains("SHA-256"), "{err}");
    assert!(!root.join("cifar-10-batches-py").exists());

    let right = ArchiveSource { url, sha256 };
    let sets = cifar::open_from(Cifar::Cifar10, &root, true, &right).unwrap();
    assert_eq!(sets.train.len(), 10);
    assert!(root.join("cifar-10-python.tar.gz").is_file());
    // Once there, the folder is read without the network.
    let offline = ArchiveSource {
        url: "http://127.0.0.1:1/unreachable".into(),
        sha256: right.sha256.clone(),
    };
    assert!(cifar::open_from(Cifar::Cifar10, &root, true, &offline).is_ok());
}

fn kiln_download_sha256(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive");
    std::fs::write(&path, bytes).unwrap();
    kiln_download::sha256_file(&path).unwrap()
}
