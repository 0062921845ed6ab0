//! `DeviceScalar<T>`: a single plain-old-data value in device memory, as RMM's
//! `device_scalar<T>`.
//!
//! Run: `cargo run --example device_scalar`.

use rmm::allocator::{Device, DeviceScalar, Result, Stream};

fn main() -> Result<()> {
    let device = Device::current()?;
    println!("backend: {}", device.backend().describe());
    let stream = Stream::new(device)?;
    let s = stream.view();

    // Uninitialized, then set asynchronously; value() copies back and synchronizes.
    let mut total = DeviceScalar::<f64>::new(s)?;
    total.set_value_async(0.5, s)?;
    println!("total = {}", total.value(s)?);

    // With an initial value. The value is staged by the scalar, so the local may change at
    // once, unlike RMM where it must outlive the copy.
    let mut local = 41u64;
    let mut counter = DeviceScalar::with_value(local, s)?;
    local += 100;
    println!("counter = {} (local is now {local})", counter.value(s)?);
    counter.set_value_async(counter.value(s)? + 1, s)?;
    println!("counter + 1 = {}", counter.value(s)?);

    // Zeroing takes a memset.
    counter.set_value_to_zero_async(s)?;
    println!("after set_value_to_zero_async: {}", counter.value(s)?);

    // A deep copy is independent of the original.
    let mut a = DeviceScalar::with_value([1i32, 2, 3], s)?;
    let b = a.deep_copy(s)?;
    a.set_value_async([7, 8, 9], s)?;
    println!("a = {:?}, its deep copy b = {:?}", a.value(s)?, b.value(s)?);
    println!("a lives at {} on {}", a.data(), a.device());
    Ok(())
}
