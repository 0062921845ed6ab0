//! `DeviceBuffer`: untyped, uninitialized device memory with RAII, as RMM's `device_buffer`.
//!
//! Run: `cargo run --example device_buffer` on a GPU, or `RMM_BACKEND=sim cargo run --example
//! device_buffer` on the simulated device.

use std::sync::Arc;

use rmm::allocator::resource::CudaAsyncMemoryResource;
use rmm::allocator::resource::SharedResource;
use rmm::allocator::{Device, DeviceBuffer, Result, Stream};

fn main() -> Result<()> {
    let device = Device::current()?;
    println!("backend: {}", device.backend().describe());
    let stream = Stream::new(device)?;
    let s = stream.view();

    // 100 uninitialized bytes from the current device's resource, allocated on `s`.
    let mut buf = DeviceBuffer::new(100, s)?;
    println!(
        "new(100): {} bytes at {} on {}, from {}",
        buf.size(),
        buf.data(),
        buf.device(),
        buf.memory_resource().name()
    );

    // Write from the host, read back: the host only ever sees copies of device bytes.
    let text = b"device memory, managed by RAII: dropped means given back on its stream.";
    buf.resize(text.len(), s)?;
    buf.copy_from_host(text, s)?;
    println!("round trip: {:?}", String::from_utf8_lossy(&buf.to_vec(s)?));

    // Shrinking the size never reallocates; shrink_to_fit does.
    let before = buf.data();
    buf.resize(14, s)?;
    println!(
        "resize(14): size {} capacity {} same allocation: {}",
        buf.size(),
        buf.capacity(),
        buf.data() == before
    );
    buf.shrink_to_fit(s)?;
    println!(
        "shrink_to_fit: size {} capacity {} -> {:?}",
        buf.size(),
        buf.capacity(),
        String::from_utf8_lossy(&buf.to_vec(s)?)
    );

    // Growing beyond the capacity reallocates exactly and keeps the contents.
    buf.reserve(4096, s)?;
    println!(
        "reserve(4096): size {} capacity {}",
        buf.size(),
        buf.capacity()
    );

    // A deep copy with an explicit stream and resource.
    let other = Stream::new(device)?;
    let pool: SharedResource = Arc::new(CudaAsyncMemoryResource::new(device)?);
    let copy = buf.deep_copy_in(other.view(), Arc::clone(&pool))?;
    println!(
        "deep copy on another stream from {}: {:?}",
        copy.memory_resource().name(),
        String::from_utf8_lossy(&copy.to_vec(other.view())?)
    );

    // The memory goes back on the stream most recently set.
    let mut moved = copy;
    moved.set_stream(s);
    println!("dropping the copy on {:?}", moved.stream());
    drop(moved);
    drop(buf);
    stream.synchronize()?;
    println!("done");
    Ok(())
}
