//! Device memory shared with other processes of the host: bytes staged in this process's
//! export arena and copied by a child process through their descriptor (the simulated device
//! through a shared file, a GPU through CUDA IPC), and the arena's slots.

mod common;

use std::process::Command;

use common::{device, on_sim, pattern};
use rmm_allocator::ipc::{ExportArena, Imports, IpcDescriptor, export_arena};

/// Set in the child process: the descriptor (hex) of the bytes to copy.
const CHILD: &str = "RMM_TEST_IPC_DESCRIPTOR";
const TEST: &str = "another_process_copies_the_bytes_a_slot_holds";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The child's part: map the parent's arena, copy the stretch to host and device, report.
fn copy_as_the_child(text: &str) {
    let desc = IpcDescriptor::from_bytes(&unhex(text)).expect("the parent's descriptor");
    let dev = device();
    let mut host = vec![0u8; desc.len as usize];
    Imports::global()
        .copy_to_host(dev, &desc, 0, &mut host)
        .expect("copy from the parent's memory to host");
    let buf =
        rmm_allocator::DeviceBuffer::new(desc.len as usize, rmm_allocator::StreamView::DEFAULT)
            .expect("a device buffer");
    Imports::global()
        .copy_to_device(dev, &desc, buf.data())
        .expect("copy from the parent's memory to this device");
    let mut back = vec![0u8; desc.len as usize];
    dev.copy_to_host(&mut back, buf.data()).expect("read back");
    assert_eq!(back, host, "the device copy and the host copy differ");
    Imports::global()
        .close_all()
        .expect("unmap the parent's arena");
    println!(
        "copied {} bytes, checksum {:016x}",
        host.len(),
        checksum(&host)
    );
}

#[test]
fn another_process_copies_the_bytes_a_slot_holds() {
    if let Ok(text) = std::env::var(CHILD) {
        // This process is the child the test below starts: its checks are the copies'.
        copy_as_the_child(&text);
        return;
    }
    let dev = device();
    let arena = export_arena(dev.ordinal()).expect("this process's exportable memory");
    let slot = arena.reserve(3 << 20).expect("a slot");
    let data = pattern(3 << 20, 7);
    dev.copy_to_device(slot.ptr(), &data)
        .expect("stage the bytes");
    let desc = slot
        .descriptor(4096, (3 << 20) - 4096)
        .expect("a stretch of the slot");
    let expected = &data[4096..];

    // This process reads its own descriptor from its own memory (a GPU cannot open its own
    // handle): the same bytes.
    let mut own = vec![0u8; expected.len()];
    Imports::global()
        .copy_to_host(dev, &desc, 0, &mut own)
        .expect("this process's own descriptor");
    assert!(
        own == expected,
        "this process read other bytes through its own descriptor"
    );

    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, hex(&desc.to_bytes()))
        .output()
        .expect("start the child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = format!(
        "copied {} bytes, checksum {:016x}",
        expected.len(),
        checksum(expected)
    );
    assert!(
        stdout.contains(&want),
        "the child copied other bytes: {stdout}\nwanted: {want}"
    );
}

#[test]
fn slots_are_handed_out_first_fit_and_merge_when_given_back() {
    let arena = ExportArena::new(device(), 4 << 20).expect("exportable memory");
    assert_eq!(arena.len(), 4 << 20);
    let a = arena.reserve(1 << 20).expect("a");
    let b = arena.reserve(1 << 20).expect("b");
    let c = arena.reserve(2 << 20).expect("c");
    assert!(arena.reserve(1).is_none(), "a full arena hands out nothing");
    assert_eq!(b.ptr().addr() - a.ptr().addr(), 1 << 20);
    drop(a);
    drop(b);
    assert_eq!(arena.available(), 2 << 20);
    let d = arena
        .reserve(2 << 20)
        .expect("the two freed slots, merged, serve 2 MiB");
    assert_eq!(d.len(), 2 << 20);
    assert!(
        d.descriptor(1 << 20, (1 << 20) + 1).is_err(),
        "past the slot's end"
    );
    drop((c, d));
    assert_eq!(arena.available(), 4 << 20);
    assert_eq!(
        arena.reserve(100).expect("small").len(),
        256,
        "slots are 256-byte aligned"
    );
}

#[test]
fn an_arena_leaves_nothing_behind() {
    use std::os::unix::fs::MetadataExt;
    if !on_sim() {
        eprintln!("skipped: a memory file backs exported memory only on the simulated device");
        return;
    }
    let arena = ExportArena::new(device(), 1 << 20).expect("exportable memory");
    let handle = arena.handle().0;
    let end = handle.iter().position(|&b| b == 0).unwrap_or(64);
    let text = std::str::from_utf8(&handle[..end]).expect("a simulated handle is text");
    let fd = text.split(':').nth(2).expect("rmm-rs-sim:pid:fd:inode");
    let path = format!("/proc/self/fd/{fd}");
    let inode = std::fs::metadata(&path)
        .expect("the arena's memory file is open")
        .ino();
    drop(arena);
    // Closed: gone, or the number reused for another file.
    assert!(
        std::fs::metadata(&path).map_or(true, |m| m.ino() != inode),
        "the arena's memory file is still open after the arena went"
    );
}

/// Set in the child process of the test below: it exports bytes, prints their descriptor and
/// waits for a line on its input before it exits.
const EXPORTER: &str = "RMM_TEST_IPC_EXPORTER";
const GONE_TEST: &str = "a_gone_peers_memory_is_unmapped_once_no_copy_uses_it";
const GONE_BYTES: usize = 1 << 20;

fn export_as_the_child() {
    use std::io::BufRead;
    let dev = device();
    let arena = export_arena(dev.ordinal()).expect("the child's exportable memory");
    let slot = arena.reserve(GONE_BYTES).expect("a slot");
    dev.copy_to_device(slot.ptr(), &pattern(GONE_BYTES, 11))
        .expect("stage the bytes");
    let desc = slot.descriptor(0, GONE_BYTES).expect("the slot's stretch");
    println!("\ndescriptor {}", hex(&desc.to_bytes()));
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .expect("the parent's word");
}

/// A child process exporting `GONE_BYTES` (see `export_as_the_child`), and its descriptor.
fn exporting_child() -> (std::process::Child, IpcDescriptor) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", GONE_TEST, "--nocapture", "--test-threads=1"])
        .env(EXPORTER, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the exporting child");
    let mut out = BufReader::new(child.stdout.take().expect("the child's output"));
    let text = (&mut out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("descriptor ")
                .map(|(_, d)| d.trim().to_string())
        })
        .expect("the child's descriptor");
    // The rest of its output is read to the end: a closed pipe would fail its last lines.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (
        child,
        IpcDescriptor::from_bytes(&unhex(&text)).expect("a descriptor"),
    )
}

/// Lets the child end, and waits for it.
fn end(mut child: std::process::Child) {
    use std::io::Write;
    writeln!(child.stdin.take().expect("the child's input"), "done").expect("tell the child");
    let status = child.wait().expect("the child ends");
    assert!(status.success(), "the exporting child failed: {status}");
}

#[test]
fn a_gone_peers_memory_is_unmapped_once_no_copy_uses_it() {
    if std::env::var(EXPORTER).is_ok() {
        export_as_the_child();
        return;
    }
    let dev = device();
    let (first, desc) = exporting_child();
    // Mappings of their own (not the process's): other tests map too.
    let imports = Imports::default();
    let mut host = vec![0u8; GONE_BYTES];
    imports
        .copy_to_host(dev, &desc, 0, &mut host)
        .expect("copy from the child's memory");
    assert!(host == pattern(GONE_BYTES, 11), "other bytes came back");
    assert_eq!(imports.mapped(), 1);
    assert_eq!(imports.forget_gone_peers(), 0, "the child runs: kept");
    // A stretch past the child's arena (a garbled message) is refused before any copy.
    let past = IpcDescriptor {
        offset: 1 << 40,
        ..desc.clone()
    };
    let e = imports
        .locate(dev, &past)
        .expect_err("a stretch past the peer's arena");
    assert!(e.to_string().contains("exported memory"), "{e}");

    let held = imports.locate(dev, &desc).expect("the child's stretch");
    end(first);
    assert_eq!(
        imports.forget_gone_peers(),
        0,
        "a mapping a copy uses stays, its process gone or not"
    );
    assert_eq!(imports.mapped(), 1);
    drop(held);

    // Mapping a new peer's arena unmaps the gone one's on the way.
    let (second, desc) = exporting_child();
    imports
        .copy_to_host(dev, &desc, 0, &mut host)
        .expect("copy from the second child's memory");
    assert!(host == pattern(GONE_BYTES, 11), "other bytes came back");
    assert_eq!(
        imports.mapped(),
        1,
        "the first child's arena went as the second's came"
    );
    end(second);
    assert_eq!(
        imports.forget_gone_peers(),
        1,
        "the gone child's arena is unmapped"
    );
    assert_eq!(imports.mapped(), 0);
}
