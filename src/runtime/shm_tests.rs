//! The shared-memory backend's tests: bit-exactness against a reference sum, and dead peers.

use super::*;

#[test]
fn names_and_cleanup() {
    assert_eq!(sanitize_run_id("a/b c"), "a_b_c");
    let p = segment_path("job", 2, "x");
    let name = p.file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with(&run_shm_prefix("job")), "{name}");
    assert!(!run_shm_prefix("job-1").starts_with(&run_shm_prefix("job")));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join(&name), b"x").unwrap();
    let other = segment_path("job-1", 0, "x");
    std::fs::write(dir.join(other.file_name().unwrap()), b"x").unwrap();
    assert_eq!(cleanup_run_shm_in(dir, "job").unwrap(), 1);
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1);
}

#[test]
fn segments_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("seg");
    // Under the usual umask 022 a default-mode file would be 0644: world-readable.
    create_segment(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // O_EXCL: an existing file is never reused.
    assert!(create_segment(&path).is_err());
}

#[test]
fn pid_liveness_sees_zombies() {
    assert!(pid_alive(std::process::id() as i32));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    // Not reaped yet: a zombie once it exits, which must count as dead.
    let t = std::time::Instant::now();
    while pid_alive(pid) {
        assert!(t.elapsed() < Duration::from_secs(10), "zombie not detected");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait().unwrap();
    assert!(!pid_alive(pid));
}

/// Deterministic pseudo-random floats in [-1, 1) with signed zeros that differ between
/// ranks (f32 max/min of -0.0 and +0.0 depend on the operand order, so a reordered fold
/// would show).
fn floats(rank: usize, len: usize, salt: u32) -> Vec<f32> {
    let mut x = 0x9e37_79b9u32.wrapping_mul(rank as u32 + 1) ^ salt.wrapping_mul(0x85eb_ca6b);
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let zero = if (rank + i) % 2 == 0 { 0.0 } else { -0.0 };
            match i % 97 {
                0 | 1 => zero,
                _ => (x as f32 / u32::MAX as f32) * 2.0 - 1.0,
            }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// The pipelined all-reduce with tiny (4 KiB) slots, so messages span many pieces whose
/// count is not a multiple of the 3 pipeline sets, sizes are not multiples of the piece or
/// of the world, and ranks lag each other (rank 1 naps): every rank must hold the bits of a
/// sequential left-to-right fold. Broadcasts and all-gathers in between use the barrier
/// sets, so a mix-up of slot sets would corrupt one side or the other.
#[test]
fn pipelined_all_reduce_matches_left_fold() {
    use crate::runtime::tests::run_world;
    use crate::runtime::{BackendChoice, Element};
    // Elements; a 4 KiB piece holds 1024 f32.
    const LENS: [usize; 7] = [1025, 2048, 3071, 5 * 1024 + 3, 7001, 1, 1023];
    const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];
    for n in [2usize, 3, 4] {
        let outs = run_world(
            n,
            BackendChoice::Shm,
            4096,
            Duration::from_secs(120),
            |pg| {
                let r = pg.rank();
                let mut got = Vec::new();
                for (k, len) in LENS.iter().enumerate() {
                    for (j, op) in OPS.iter().enumerate() {
                        if r == 1 && (k + j) % 3 == 0 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                        let mut b = floats(r, *len, (k * 4 + j) as u32);
                        pg.all_reduce(&mut b, *op).expect("all_reduce");
                        got.push(bits(&b));
                        let mut c = vec![r as f32; 1500];
                        pg.broadcast(&mut c, (k + j) % pg.world_size())
                            .expect("broadcast");
                        assert!(c.iter().all(|x| *x == ((k + j) % pg.world_size()) as f32));
                        let mut g = vec![0.0f32; 1500 * pg.world_size()];
                        pg.all_gather(&vec![r as f32; 1500], &mut g)
                            .expect("all_gather");
                        assert!(g.iter().enumerate().all(|(i, x)| *x == (i / 1500) as f32));
                    }
                }
                got
            },
        );
        let mut want = Vec::new();
        for (k, len) in LENS.iter().enumerate() {
            for (j, op) in OPS.iter().enumerate() {
                let salt = (k * 4 + j) as u32;
                let mut acc = floats(0, *len, salt);
                for r in 1..n {
                    f32::reduce(&mut acc, &floats(r, *len, salt), *op);
                }
                if *op == ReduceOp::Avg {
                    f32::div(&mut acc, n);
                }
                want.push(bits(&acc));
            }
        }
        for (r, got) in outs.iter().enumerate() {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "n {n} rank {r} case {i}: differs from the left fold"
                );
            }
        }
    }
}

/// Integer and half types through the 2-rank one-pass fold and the general path.
#[test]
fn pipelined_all_reduce_other_dtypes() {
    use crate::runtime::tests::run_world;
    use crate::runtime::BackendChoice;
    for n in [2usize, 3] {
        let outs = run_world(
            n,
            BackendChoice::Shm,
            4096,
            Duration::from_secs(120),
            |pg| {
                let r = pg.rank() as i64;
                let mut a: Vec<i64> = (0..3001).map(|i| (i * 7 + r * 13) % 29 - 14).collect();
                pg.all_reduce(&mut a, ReduceOp::Max).expect("max");
                let mut b: Vec<half::bf16> = (0..5003)
                    .map(|i| half::bf16::from_f32(((i + r) % 17) as f32 - 8.0))
                    .collect();
                pg.all_reduce(&mut b, ReduceOp::Sum).expect("sum");
                let mut c: Vec<i32> = vec![r as i32 + 1; 4097];
                pg.all_reduce(&mut c, ReduceOp::Avg).expect("avg");
                (a, b, c)
            },
        );
        let n64 = n as i64;
        for (a, b, c) in &outs {
            for (i, x) in a.iter().enumerate() {
                let want = (0..n64).map(|r| (i as i64 * 7 + r * 13) % 29 - 14).max();
                assert_eq!(Some(*x), want, "max at {i}");
            }
            for (i, x) in b.iter().enumerate() {
                let want: f32 = (0..n).map(|r| ((i + r) % 17) as f32 - 8.0).sum();
                assert_eq!(x.to_f32(), want, "bf16 sum at {i}");
            }
            let want = (1..=n as i32).sum::<i32>() / n as i32;
            assert!(c.iter().all(|x| *x == want), "i32 avg");
        }
    }
}

#[test]
fn layout_is_page_aligned() {
    let (h, len) = layout(4, 4096);
    assert_eq!(h, 4096);
    assert_eq!(len, 4096 + 5 * 4 * 4096);
    assert_eq!(layout(100, 64).0, 8192);
}
