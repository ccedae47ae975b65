//! `kiln devices`: the probe as a table.

use kiln_backend::{BackendChoice, DeviceInfo, DeviceSelection, Probe, probe, resolve};

pub fn run(choice: BackendChoice, selection: &DeviceSelection) -> anyhow::Result<()> {
    let probe = probe();
    match choice {
        BackendChoice::Auto => print!("{}", render(&probe)),
        BackendChoice::Explicit(backend) => {
            for device in probe.report(backend).devices()? {
                println!("{}", device_line(device));
            }
        }
    }
    let resolved = resolve(choice, selection, &probe)?;
    let chosen: Vec<String> = resolved
        .devices
        .iter()
        .map(|d| format!("{}:{} {}", d.backend, d.index, d.name))
        .collect();
    println!(
        "--backend {choice} --devices {selection} uses: {}",
        chosen.join(", ")
    );
    Ok(())
}

fn render(probe: &Probe) -> String {
    let mut out = String::new();
    for report in probe.reports() {
        match report.devices() {
            Ok(devices) => {
                out += &format!("{}\n", report.backend);
                for device in devices {
                    out += &format!("  {}\n", device_line(device));
                }
            }
            Err(why) => out += &format!("{} (unavailable: {why})\n", report.backend),
        }
    }
    out
}

fn device_line(device: &DeviceInfo) -> String {
    let memory = device
        .memory_bytes
        .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
        .unwrap_or_else(|| "memory unknown".to_string());
    format!(
        "{}:{}  {}  [{}]  {}  {}",
        device.backend, device.index, device.name, device.kind, memory, device.detail
    )
}
