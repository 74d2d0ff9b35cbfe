//! A short, deterministic fuzz run of the cloud-config parser on stable Rust: thousands of
//! inputs mutated from valid documents (byte flips, splices, truncations, YAML-significant
//! characters) and random ones. The same entry as the cargo-fuzz target in `fuzz/`.

use byoh_agent::cloudinit::check_input;

const SEEDS: &[&str] = &[
    "#cloud-config\nwrite_files:\n  - path: /etc/a\n    content: hi\n    permissions: '0600'\n    owner: root:root\nruncmd:\n  - echo hi\n  - [ls, -l]\n",
    "#cloud-config\nwrite_files:\n  - path: /etc/b\n    encoding: gz+b64\n    content: H4sIAAAAAAAAA8tIzcnJV0iv4gIAGJpUaQkAAAA=\n    append: true\n",
    "#cloud-config\nwrite_files:\n  - {path: /x, encoding: b64, content: aGk=}\nruncmd: [\"a\", [b, c]]\n",
    "#cloud-config\npackages: [kubelet]\n",
    "runcmd:\n  - &a echo\n  - *a\n",
    "write_files: [{path: /etc/c, permissions: 0755, owner: 0:0, encoding: base64, content: !!binary aGk=}]\n",
];

const SPICE: &[&[u8]] = &[
    b":",
    b"-",
    b"\n",
    b" ",
    b"[",
    b"]",
    b"{",
    b"}",
    b"&a",
    b"*a",
    b"!!",
    b"'",
    b"\"",
    b"#",
    b"\t",
    b"|",
    b">",
    b"%",
    b"@",
    b"0o777",
    b"99999999999999999999",
    b"\xff",
    b"\0",
    b"encoding: gzip+base64",
    b"permissions: '7777777'",
    b"owner: a:b:c",
    b"append: yes",
];

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(5) {
            0 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] ^= 1 << rng.below(8);
            }
            1 => {
                let spice = SPICE[rng.below(SPICE.len())];
                input.splice(at..at, spice.iter().copied());
            }
            2 => input.truncate(at),
            3 if !input.is_empty() => {
                let from = rng.below(input.len());
                let len = rng.below(input.len() - from + 1).min(64);
                let chunk: Vec<u8> = input[from..from + len].to_vec();
                input.splice(at..at, chunk);
            }
            _ => {
                let end = (at + rng.below(8)).min(input.len());
                input.drain(at..end);
            }
        }
    }
}

#[test]
fn the_parser_never_panics() {
    let mut rng = Rng(0x5eed_b00d_cafe_f00d);
    let mut runs = 0;
    for round in 0..4000 {
        let mut input = if round % 10 == 9 {
            (0..rng.below(200)).map(|_| rng.below(256) as u8).collect()
        } else {
            SEEDS[rng.below(SEEDS.len())].as_bytes().to_vec()
        };
        mutate(&mut rng, &mut input);
        let text = String::from_utf8_lossy(&input);
        check_input(&text);
        runs += 1;
    }
    for seed in SEEDS {
        check_input(seed);
    }
    assert_eq!(runs, 4000);
}
