//! Seeded standard normal draws, the same on any machine.

/// SplitMix64's output function: a 64-bit mix (Steele et al. 2014).
pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Standard normal draws: Marsaglia and Tsang's ziggurat (2000) with 128
/// layers over a SplitMix64 stream, the layer and the value from separate
/// bits of each draw (Doornik 2005); ~99% of draws are one product.
pub(super) struct Normals {
    state: u64,
}

/// The ziggurat's tables: `k[i]` the acceptance bound of layer `i`, `w[i]`
/// its scale from a 32-bit integer to a value, `f[i]` the density at its
/// edge.
struct Ziggurat {
    k: [u32; 128],
    w: [f32; 128],
    f: [f32; 128],
}

/// The right edge of the base layer.
const ZIG_R: f64 = 3.442_619_855_899;

static ZIGGURAT: std::sync::LazyLock<Ziggurat> = std::sync::LazyLock::new(|| {
    let m1 = 2_147_483_648.0f64;
    let vn = 9.912_563_035_262_17e-3f64;
    let (mut dn, mut tn) = (ZIG_R, ZIG_R);
    let q = vn / (-0.5 * dn * dn).exp();
    let mut z = Ziggurat {
        k: [0; 128],
        w: [0.0; 128],
        f: [0.0; 128],
    };
    z.k[0] = ((dn / q) * m1) as u32;
    z.w[0] = (q / m1) as f32;
    z.w[127] = (dn / m1) as f32;
    z.f[0] = 1.0;
    z.f[127] = (-0.5 * dn * dn).exp() as f32;
    for i in (1..=126).rev() {
        dn = (-2.0 * (vn / dn + (-0.5 * dn * dn).exp()).ln()).sqrt();
        z.k[i + 1] = ((dn / tn) * m1) as u32;
        tn = dn;
        z.f[i] = (-0.5 * dn * dn).exp() as f32;
        z.w[i] = (dn / m1) as f32;
    }
    z
});

impl Normals {
    pub(super) fn new(seed: u64) -> Self {
        Normals { state: seed }
    }

    fn bits(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A uniform in (0, 1].
    fn uniform(&mut self) -> f32 {
        ((self.bits() >> 40) as f32 + 1.0) * (1.0 / (1u32 << 24) as f32)
    }

    pub(super) fn next(&mut self) -> f32 {
        let z = &*ZIGGURAT;
        loop {
            let r = self.bits();
            let hz = r as u32 as i32;
            let iz = ((r >> 32) & 127) as usize;
            let x = hz as f32 * z.w[iz];
            if hz.unsigned_abs() < z.k[iz] {
                return x;
            }
            if iz == 0 {
                // The tail beyond ZIG_R (Marsaglia 1964).
                let r = ZIG_R as f32;
                loop {
                    let x = -self.uniform().ln() / r;
                    let y = -self.uniform().ln();
                    if y + y >= x * x {
                        return if hz > 0 { r + x } else { -r - x };
                    }
                }
            }
            let u = self.uniform();
            if z.f[iz] + u * (z.f[iz - 1] - z.f[iz]) < (-0.5 * x * x).exp() {
                return x;
            }
        }
    }
}
