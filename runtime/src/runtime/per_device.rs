//! Work done once per device during a switch, in parallel when there are several devices.
//!
//! Several devices' steps run at once on rayon's pool (their pools allocate, their data
//! spills, at the same time). One device's step runs on the calling thread without touching
//! the pool: its first use starts a thread per CPU (after reading the cgroup's CPU quota),
//! which a process with one device (a Dask worker, say) never needs.

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
