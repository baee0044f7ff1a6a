//! The floor of any collapse stage that finds a line's earlier copies by its text (issue 29's
//! CPU goal): what hashing every line costs, and hashing plus one access to an index slot, per
//! line, on lines as the console receives them (pipe-sized chunks, just read, so in cache).
//!
//! Built and run by `scripts/bench-console.py --floor` (`rustc -O`, no dependencies), which sets
//! the numbers beside `--output all`'s own CPU per line measured in the same run: whatever a
//! stage does besides, it cannot cost less than this. The hash is the cheapest honest one (an
//! FxHash-style multiply per 8 bytes, weaker and cheaper than the stage's foldhash), so the floor
//! is if anything too low.
//!
//! Usage: collapse-floor LINES_PER_RANK RANKS same|differ PENDING_LINES (`rustc --edition 2021`)

use std::time::Instant;

const K: u64 = 0xf135_7aea_2e62_a9c5;

/// FxHash-style: one multiply per 8-byte word, the last word overlapping the one before it
/// (no byte loop for the tail).
fn hash(text: &[u8]) -> u32 {
    let word = |i: usize| u64::from_le_bytes(text[i..i + 8].try_into().unwrap());
    let n = text.len();
    let mut h = (n as u64).wrapping_mul(K);
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            h = (h.rotate_left(5) ^ word(i)).wrapping_mul(K);
            i += 8;
        }
        h = (h.rotate_left(5) ^ word(n - 8)).wrapping_mul(K);
    } else {
        for &b in text {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    ((h >> 32) as u32).max(1)
}

/// One chunk as a forwarder hands it over: about 64 KiB of whole lines and where each ends.
fn chunk(rank: usize, from: usize, to: usize, same: bool, body: &mut Vec<u8>, ends: &mut Vec<u32>) {
    use std::io::Write;
    body.clear();
    ends.clear();
    for i in from..to {
        if same {
            writeln!(body, "step {i} loss 0.5").unwrap();
        } else {
            writeln!(body, "rank {rank} step {i} loss 0.5").unwrap();
        }
        ends.push(body.len() as u32);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: collapse-floor LINES_PER_RANK RANKS same|differ PENDING_LINES");
        std::process::exit(2);
    }
    let per: usize = args[1].parse().expect("LINES_PER_RANK");
    let ranks: usize = args[2].parse().expect("RANKS");
    let same = args[3] == "same";
    let pending: usize = args[4].parse().expect("PENDING_LINES");
    let per_chunk = 2500; // ~64 KiB of these lines: one pipe read
    let (mut body, mut ends) = (Vec::new(), Vec::new());
    // Chunk making is not timed: each mode times only its own work on a chunk just made.
    let mut t_hash = 0u128;
    let mut t_index = 0u128;
    let mut acc = 0u32;
    let size = (pending * 4).next_power_of_two();
    let mask = size - 1;
    let mut table = vec![(0u32, 0u32); size];
    let mut next = 0u64;
    let mut lines = 0u64;
    let mut from = 0;
    while from < per {
        let to = (from + per_chunk).min(per);
        for rank in 0..ranks {
            chunk(rank, from, to, same, &mut body, &mut ends);
            // Hash only.
            let t = Instant::now();
            let mut s = 0usize;
            for &e in &ends {
                acc ^= hash(&body[s..e as usize]);
                s = e as usize;
            }
            t_hash += t.elapsed().as_nanos();
            // Hash, and one load and one store of the line's slot in a table sized to the
            // pending lines (four slots each, as the stage's index): any hash index does at
            // least this per line; probing, deleting and the entry itself come on top.
            let t = Instant::now();
            let mut s = 0usize;
            for &e in &ends {
                let h = hash(&body[s..e as usize]);
                s = e as usize;
                let p = h as usize & mask;
                acc ^= (table[p].0 == h) as u32;
                table[p] = (h, next as u32);
                next += 1;
            }
            t_index += t.elapsed().as_nanos();
            lines += ends.len() as u64;
        }
        from = to;
    }
    std::hint::black_box(acc);
    println!(
        "hash {:.2} ns/line, hash+index {:.2} ns/line ({lines} lines)",
        t_hash as f64 / lines as f64,
        t_index as f64 / lines as f64
    );
}
