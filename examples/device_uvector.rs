//! `DeviceUVector<T>`: an uninitialized vector of plain-old-data elements, as RMM's
//! `device_uvector<T>`.
//!
//! Run: `cargo run --example device_uvector`.

use rmm::allocator::{Device, DeviceUVector, Error, Result, Stream};

fn main() -> Result<()> {
    let device = Device::current()?;
    println!("backend: {}", device.backend().describe());
    let stream = Stream::new(device)?;
    let s = stream.view();

    // Room for 8 u32 elements, uninitialized; fill from the host.
    let mut v = DeviceUVector::<u32>::new(8, s)?;
    v.copy_from_host(&[1, 1, 2, 3, 5, 8, 13, 21], s)?;
    println!(
        "len {} capacity {}: {:?}",
        v.len(),
        v.capacity(),
        v.to_vec(s)?
    );

    // Element access copies one element; out of range is an error, not undefined behaviour.
    println!(
        "element(6) = {}, front = {}, back = {}",
        v.element(6, s)?,
        v.front_element(s)?,
        v.back_element(s)?
    );
    match v.element(8, s) {
        Err(e @ Error::IndexOutOfRange { .. }) => println!("element(8): {e}"),
        other => println!("element(8) unexpectedly gave {other:?}"),
    }

    // Asynchronous sets take the value by value: nothing borrowed outlives the call.
    for i in 0..v.len() {
        let square = (i * i) as u32;
        v.set_element_async(i, square, s)?;
    }
    v.set_element_to_zero_async(1, s)?;
    println!("after async sets: {:?}", v.to_vec(s)?);

    // Growing beyond capacity reallocates and keeps the elements; new ones are uninitialized.
    v.resize(10, s)?;
    v.set_element(8, 64, s)?;
    v.set_element(9, 81, s)?;
    println!("resize(10): {:?}", v.to_vec(s)?);

    // Shrinking keeps the allocation until shrink_to_fit.
    v.resize(3, s)?;
    println!("resize(3): len {} capacity {}", v.len(), v.capacity());
    v.shrink_to_fit(s)?;
    println!("shrink_to_fit: len {} capacity {}", v.len(), v.capacity());

    // release() hands the allocation over as an untyped DeviceBuffer, data intact.
    let buf = v.release();
    println!("released: {} bytes: {:?}", buf.size(), buf.to_vec(s)?);
    let back = DeviceUVector::<u32>::from_buffer(buf)?;
    println!("and back: {:?}", back.to_vec(s)?);
    Ok(())
}
