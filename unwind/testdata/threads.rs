// The Rust program of the LLD test: a spawned thread blocks in read(2) on
// stdin below level2 → level3, and the main thread in join. rustc links
// with LLD (rust-lld) by default on x86_64 Linux.
use std::hint::black_box;
use std::io::{Read, Write};

#[inline(never)]
fn level3() -> usize {
    let mut buf = [0u8; 64];
    let n = std::io::stdin().lock().read(&mut buf).unwrap_or(0);
    black_box(n) + 3
}

#[inline(never)]
fn level2() -> usize {
    black_box(level3()) * 2
}

fn main() {
    let t = std::thread::spawn(|| black_box(level2()));
    println!("ready");
    std::io::stdout().flush().unwrap();
    let _ = t.join();
}
