//! Per-device work of a switch: several devices' steps run at once on rayon's pool (their
//! pools allocate, their data spills, together); a single device's runs on the calling thread,
//! sparing a one-device process (a Dask worker) rayon's thread per CPU.

use rayon::prelude::*;

/// `f(0)`, …, `f(n - 1)`, in order: at once on rayon's pool when `n > 1`, here otherwise.
pub(super) fn map_devices<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    if n > 1 {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_device_order_whether_one_or_several() {
        assert_eq!(map_devices(0, |i| i), Vec::<usize>::new());
        assert_eq!(map_devices(1, |i| i * 10), vec![0]);
        assert_eq!(map_devices(5, |i| i * 10), vec![0, 10, 20, 30, 40]);
    }

    #[test]
    fn one_device_runs_on_the_calling_thread() {
        let here = std::thread::current().id();
        assert_eq!(map_devices(1, |_| std::thread::current().id()), vec![here]);
    }
}
