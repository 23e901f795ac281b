//! Compute device selection.
//!
//! larder's hot path runs on the CPU through its own kernels; candle devices are
//! selected here so that accelerated backends (Metal on macOS, CUDA behind the
//! opt-in `cuda` feature) have one place to come from.

use candle_core::Device;

/// Which device the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The host CPU (always available).
    #[default]
    Cpu,
    /// Apple GPU through Metal (macOS builds only).
    Metal,
    /// NVIDIA GPU through CUDA (builds with the `cuda` feature only).
    Cuda,
}

/// Opens the requested candle device, or explains why it is not available.
pub fn open(choice: DeviceChoice) -> Result<Device, candle_core::Error> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Metal => Device::new_metal(0),
        DeviceChoice::Cuda => Device::new_cuda(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_always_opens() {
        assert!(open(DeviceChoice::Cpu).unwrap().is_cpu());
    }
}
