// A Rust program that blocks in read(2) below main → level1 →
// Reader<u32>::level2 → level3, for the demangling tests (legacy and v0
// mangling).
use std::io::{Read, Write};

pub struct Reader<T> {
    n: T,
}

impl<T: Copy + Into<u64>> Reader<T> {
    #[inline(never)]
    fn level2(&self) -> u64 {
        level3() + self.n.into()
    }
}

#[inline(never)]
fn level3() -> u64 {
    let mut b = [0u8; 8];
    let n = std::io::stdin().lock().read(&mut b).unwrap_or(0);
    std::hint::black_box(n as u64 + 3)
}

#[inline(never)]
fn level1(v: &[u8]) -> u64 {
    let r = Reader { n: std::hint::black_box(2u32) };
    r.level2() + v.len() as u64
}

fn main() {
    println!("ready");
    std::io::stdout().flush().unwrap();
    let v = vec![1u8];
    std::process::exit((std::hint::black_box(level1(&v)) & 0) as i32)
}
