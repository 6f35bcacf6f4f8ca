use sluice_kernels::probe::{fma_loop, random_bytes, BATCH_SHAPE};
use sluice_kernels::{isa, matmul, Matrix, Pool};

fn on_cpu_ns() -> u64 {
    if std::env::var("WALL").is_ok() {
        static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        return T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64;
    }
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}
fn rate(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut v = Vec::new();
    for _ in 0..reps {
        let t0 = on_cpu_ns();
        let mut flops = 0.0;
        let mut dt = 0;
        while dt < 100_000_000 {
            flops += f();
            dt = on_cpu_ns() - t0;
        }
        v.push(flops / dt as f64);
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
fn main() {
    let reps: usize = std::env::args().nth(1).map_or(5, |a| a.parse().unwrap());
    let ts: Vec<usize> = std::env::args()
        .nth(2)
        .map_or(vec![256], |a| a.split(',').map(|x| x.parse().unwrap()).collect());
    let fmts: String = std::env::args().nth(3).unwrap_or("bf16".into());
    let isa = isa();
    let peak = rate(reps, || fma_loop(isa, 1 << 22));
    let (rows, cols) = BATCH_SHAPE;
    let mut bytes = random_bytes(4 * rows * cols, 7);
    for hi in bytes.iter_mut().skip(1).step_by(2) {
        *hi = (*hi & 0x83) | 0x3C;
    }
    let int8_scales = [0x00, 0x20].repeat(rows);
    let pool = Pool::new(std::env::var("THREADS").map_or(1, |v| v.parse().unwrap())).unwrap();
    for name in fmts.split(',') {
        let m = match name {
            "int8" => Matrix::int8_row(rows, cols, &bytes[..rows * cols], &int8_scales).unwrap(),
            "f32" => Matrix::f32(rows, cols, &bytes[..4 * rows * cols]).unwrap(),
            _ => Matrix::bf16(rows, cols, &bytes[..2 * rows * cols]).unwrap(),
        };
        for &t in &ts {
            let x0: Vec<f32> = random_bytes(t * m.cols(), 11)
                .into_iter()
                .map(|b| f32::from(b) / 128.0 - 1.0)
                .collect();
            #[repr(C, align(64))]
            #[derive(Clone, Copy)]
            struct L([f32; 16]);
            let mut lines = vec![L([0.0; 16]); x0.len() / 16 + 2];
            let off: usize = std::env::var("XOFF").map_or(4, |v| v.parse().unwrap());
            let x: &mut [f32] = unsafe {
                std::slice::from_raw_parts_mut((lines.as_mut_ptr() as *mut f32).add(off), x0.len())
            };
            x.copy_from_slice(&x0);
            let mut out = vec![0.0f32; t * m.rows()];
            let flops = 2.0 * (m.rows() * m.cols() * t) as f64;
            let r = pool.install(|| {
                rate(reps, || {
                    matmul(&m, x, t, &mut out);
                    flops
                })
            });
            println!("{name} T={t} {r:.1} GF/s {:.1}% (peak {peak:.1})", 100.0 * r / peak);
        }
    }
}
