//! Whether every machine of a multi-machine run is still there.
//!
//! burn-collective's all-reduce waits for every machine without a time limit, and a machine
//! that dies (killed, out of memory, powered off) does not always break the others'
//! connections: they can wait forever. So the machines keep a line of their own, as PyTorch's
//! elastic agents keep a heartbeat: each machine holds one TCP connection to machine 0 (on the
//! coordinator's port + 1 + the number of machines, the first port after the machines' own), and
//! both ends send a byte every second. A connection that closes without a goodbye, or stays
//! silent for [`SILENCE`], marks its machine lost; machine 0 tells the others which machine it
//! lost. Replicas waiting in an all-reduce look at [`lost`] while they wait (see
//! `Replicas::on_each`), so every machine stops within seconds with one line naming the machine.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::ParallelError;

/// How long a machine may be silent before it counts as lost. Each machine sends a byte every
/// [`BEAT`] from a thread of its own, so only a machine that is gone (or stopped, or cut off)
/// stays silent this long.
pub const SILENCE: Duration = Duration::from_secs(15);

/// How often each end of a connection says it is there.
const BEAT: Duration = Duration::from_secs(1);

/// The bytes on the line: a heartbeat, a goodbye (the machine finished the run), and, from
/// machine 0, `LOST` followed by the lost machine's number (4 bytes, little-endian).
const ALIVE: u8 = b'.';
const GOODBYE: u8 = b'B';
const LOST: u8 = b'L';

/// Why the run lost a machine, once it has.
static LOST_MACHINE: Mutex<Option<String>> = Mutex::new(None);

/// Set once this machine has said goodbye: what happens to the connections after that does not
/// matter to it.
static LEFT: AtomicBool = AtomicBool::new(false);

/// This machine's open connections (one on machines 1 and up, one per machine on machine 0),
/// with the number of the machine at the other end.
static LINES: Mutex<Vec<(usize, TcpStream)>> = Mutex::new(Vec::new());

/// Why a machine of the run was lost, if one was (see the module doc).
pub fn lost() -> Option<String> {
    LOST_MACHINE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The heartbeat's port: the first after the coordinator's and the machines' default ones.
pub fn port(coordinator_port: u16, nodes: usize) -> u16 {
    coordinator_port.saturating_add(1 + nodes as u16)
}

/// Starts this machine's side: machine 0 listens on `port` for the others (an error if the port
/// is taken), the others connect to `host:port` in the background (retrying until machine 0 is
/// up, as joining the coordinator waits for it too).
pub fn start(rank: usize, host: &str, port: u16) -> Result<(), ParallelError> {
    if rank == 0 {
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|error| ParallelError::HeartbeatPort(port, error.to_string()))?;
        std::thread::Builder::new()
            .name("kiln-heartbeat".into())
            .spawn(move || accept(listener))
            .map_err(|error| ParallelError::HeartbeatPort(port, error.to_string()))?;
    } else {
        let address = format!("{host}:{port}");
        std::thread::Builder::new()
            .name("kiln-heartbeat".into())
            .spawn(move || connect(rank, &address))
            .map_err(|error| ParallelError::HeartbeatPort(port, error.to_string()))?;
    }
    std::thread::Builder::new()
        .name("kiln-heartbeat-beat".into())
        .spawn(beat)
        .map_err(|error| ParallelError::HeartbeatPort(port, error.to_string()))?;
    Ok(())
}

/// Says goodbye on every connection: this machine has finished the run (after the run's last
/// barrier), so its connections closing loses nothing.
pub fn leave() {
    LEFT.store(true, Ordering::SeqCst);
    for (_, line) in lines().iter_mut() {
        let _ = line.write_all(&[GOODBYE]);
        let _ = line.shutdown(Shutdown::Write);
    }
}

fn lines() -> std::sync::MutexGuard<'static, Vec<(usize, TcpStream)>> {
    LINES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records the first machine lost (and, on machine 0, tells the others which).
fn record(machine: usize, why: String) {
    if LEFT.load(Ordering::SeqCst) {
        return;
    }
    {
        let mut lost = LOST_MACHINE.lock().unwrap_or_else(|e| e.into_inner());
        if lost.is_some() {
            return;
        }
        *lost = Some(format!("machine {machine} {why}"));
    }
    let mut message = vec![LOST];
    message.extend_from_slice(&(machine as u32).to_le_bytes());
    for (_, line) in lines().iter_mut() {
        let _ = line.write_all(&message);
    }
}

/// Machine 0: takes each machine's connection, which starts with its number.
fn accept(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        let mut stream = stream;
        let _ = stream.set_read_timeout(Some(SILENCE));
        let _ = stream.set_write_timeout(Some(SILENCE));
        let mut rank = [0u8; 4];
        if stream.read_exact(&mut rank).is_err() {
            continue;
        }
        let machine = u32::from_le_bytes(rank) as usize;
        let Ok(writer) = stream.try_clone() else {
            continue;
        };
        lines().push((machine, writer));
        let _ = std::thread::Builder::new()
            .name(format!("kiln-heartbeat-{machine}"))
            .spawn(move || listen(machine, stream, true));
    }
}

/// Machines 1 and up: connects to machine 0, says which machine this is, and listens.
fn connect(rank: usize, address: &str) {
    let stream = loop {
        let connected = address
            .to_socket_addrs()
            .ok()
            .and_then(|mut addresses| addresses.next())
            .and_then(|address| TcpStream::connect_timeout(&address, SILENCE).ok());
        if let Some(stream) = connected {
            break stream;
        }
        if LEFT.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = stream.set_read_timeout(Some(SILENCE));
    let _ = stream.set_write_timeout(Some(SILENCE));
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(_) => return,
    };
    if writer.write_all(&(rank as u32).to_le_bytes()).is_err() {
        return record(0, "could not be reached on its heartbeat port".into());
    }
    lines().push((0, writer));
    listen(0, stream, false);
}

/// Reads the connection to `machine` until it ends: a goodbye ends it well; anything else
/// (closed, reset, silent too long) loses the machine. On machine 0 (`hub`), a lost machine's
/// number comes only from its own connection; elsewhere machine 0 may name another machine.
fn listen(machine: usize, mut stream: TcpStream, hub: bool) {
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(1) if byte[0] == ALIVE => continue,
            Ok(1) if byte[0] == GOODBYE => return,
            Ok(1) if byte[0] == LOST && !hub => {
                let mut other = [0u8; 4];
                if stream.read_exact(&mut other).is_ok() {
                    let other = u32::from_le_bytes(other) as usize;
                    return record(
                        other,
                        "left the run (machine 0 lost its connection to it)".into(),
                    );
                }
                return record(machine, "closed its connection".into());
            }
            Ok(1) => continue,
            Ok(_) => {
                return record(
                    machine,
                    "left the run without finishing (its connection closed; its own output says why)"
                        .into(),
                );
            }
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return record(
                    machine,
                    format!("has not been heard from for {} s", SILENCE.as_secs()),
                );
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return record(machine, format!("lost its connection ({error})")),
        }
    }
}

/// Sends a heartbeat on every connection each [`BEAT`], until this machine leaves.
fn beat() {
    while !LEFT.load(Ordering::SeqCst) {
        for (_, line) in lines().iter_mut() {
            let _ = line.write_all(&[ALIVE]);
        }
        std::thread::sleep(BEAT);
    }
}
