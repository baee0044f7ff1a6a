//! The TCPStore wire codec: query types, the validation magic, request decoding and encoding and
//! the reply layouts. Pure functions over byte slices; no I/O.
//!
//! Layouts follow PyTorch 2.15.0 (`torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp` for the
//! enums, `TCPStore.cpp` for the client's encoding, `TCPStoreLibUvBackend.cpp` for the server's
//! parsing and limits). Integers are raw host-order copies of the C++ values in PyTorch; every
//! platform PyTorch supports is little-endian, so this codec reads and writes little-endian.
//! Lengths and counts are `u64`; strings are `u64 len` + bytes.
//!
//! Decoding is incremental: [`decode_request`] re-parses from the start of the buffered bytes and
//! returns [`Decoded::Incomplete`] (a normal, non-error outcome) until a whole request is there.
//! Limits are checked as soon as a length field is read, so an oversized request is rejected before
//! its payload is buffered.

use thiserror::Error;

/// First request of every connection: opcode 0 followed by this `u32` (`validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// One-byte opcodes, in the order of PyTorch 2.15.0's `enum class QueryType : uint8_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QueryType {
    Validate = 0,
    Set = 1,
    CompareSet = 2,
    Get = 3,
    Add = 4,
    Check = 5,
    Wait = 6,
    GetNumKeys = 7,
    DeleteKey = 8,
    Append = 9,
    MultiGet = 10,
    MultiSet = 11,
    CancelWait = 12,
    Ping = 13,
    QueuePush = 14,
    QueuePop = 15,
    QueueLen = 16,
    ListKeys = 17,
    Barrier = 18,
}

impl QueryType {
    /// Every query type, in opcode order.
    pub const ALL: [QueryType; 19] = [
        QueryType::Validate,
        QueryType::Set,
        QueryType::CompareSet,
        QueryType::Get,
        QueryType::Add,
        QueryType::Check,
        QueryType::Wait,
        QueryType::GetNumKeys,
        QueryType::DeleteKey,
        QueryType::Append,
        QueryType::MultiGet,
        QueryType::MultiSet,
        QueryType::CancelWait,
        QueryType::Ping,
        QueryType::QueuePush,
        QueryType::QueuePop,
        QueryType::QueueLen,
        QueryType::ListKeys,
        QueryType::Barrier,
    ];

    /// The query type for an opcode byte, or `None` for an unknown opcode.
    pub fn from_u8(b: u8) -> Option<QueryType> {
        QueryType::ALL.get(usize::from(b)).copied()
    }
}

/// `CheckResponseType` in `TCPStoreBackend.hpp`.
pub const CHECK_READY: u8 = 0;
/// `CheckResponseType::NOT_READY`.
pub const CHECK_NOT_READY: u8 = 1;
/// `WaitResponseType::STOP_WAITING`: reply to a finished WAIT or BARRIER.
pub const STOP_WAITING: u8 = 0;
/// `WaitResponseType::WAIT_CANCELED`: reply to CANCEL_WAIT.
pub const WAIT_CANCELED: u8 = 1;

/// Size limits the server enforces while decoding. Exceeding one closes the connection, as in
/// PyTorch's libuv server (`MAX_STRING_LEN`, `MAX_PAYLOAD_LEN`, `MAX_KEY_COUNT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key in bytes (PyTorch libuv: 8192).
    pub max_key_len: u64,
    /// Longest value in bytes (PyTorch libuv: 8 MiB).
    pub max_value_len: u64,
    /// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET (PyTorch libuv: 131072).
    pub max_keys_per_request: u64,
    /// Most bytes one request may occupy in total. PyTorch has no such bound (a MULTI_SET could
    /// legally be 131072 x 8 MiB); this one keeps one connection's buffer bounded.
    pub max_request_len: u64,
}

impl Limits {
    /// PyTorch 2.15.0 libuv limits (`TCPStoreLibUvBackend.cpp`).
    pub const PYTORCH: Limits = Limits {
        max_key_len: 8192,
        max_value_len: 8 * 1024 * 1024,
        max_keys_per_request: 128 * 1024,
        max_request_len: u64::MAX,
    };
}

impl Default for Limits {
    /// PyTorch's per-field limits, plus a 1 GiB bound on a single request.
    fn default() -> Self {
        Limits {
            max_request_len: 1 << 30,
            ..Limits::PYTORCH
        }
    }
}

/// One decoded request. Keys and values are raw bytes as on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Validate {
        magic: u32,
    },
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    GetNumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
    ListKeys,
    Barrier {
        key: Vec<u8>,
        world_size: i64,
    },
}

impl Request {
    /// The opcode of this request.
    pub fn query_type(&self) -> QueryType {
        match self {
            Request::Validate { .. } => QueryType::Validate,
            Request::Set { .. } => QueryType::Set,
            Request::CompareSet { .. } => QueryType::CompareSet,
            Request::Get { .. } => QueryType::Get,
            Request::Add { .. } => QueryType::Add,
            Request::Check { .. } => QueryType::Check,
            Request::Wait { .. } => QueryType::Wait,
            Request::GetNumKeys => QueryType::GetNumKeys,
            Request::DeleteKey { .. } => QueryType::DeleteKey,
            Request::Append { .. } => QueryType::Append,
            Request::MultiGet { .. } => QueryType::MultiGet,
            Request::MultiSet { .. } => QueryType::MultiSet,
            Request::CancelWait => QueryType::CancelWait,
            Request::Ping { .. } => QueryType::Ping,
            Request::QueuePush { .. } => QueryType::QueuePush,
            Request::QueuePop { .. } => QueryType::QueuePop,
            Request::QueueLen { .. } => QueryType::QueueLen,
            Request::ListKeys => QueryType::ListKeys,
            Request::Barrier { .. } => QueryType::Barrier,
        }
    }

    /// Appends this request's wire bytes to `out`, exactly as PyTorch's client lays them out.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.query_type() as u8);
        match self {
            Request::Validate { magic } => out.extend_from_slice(&magic.to_le_bytes()),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_str(out, key);
                put_str(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_str(out, key);
                put_str(out, expected);
                put_str(out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put_str(out, key),
            Request::Add { key, delta } => {
                put_str(out, key);
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.len() as u64);
                for k in keys {
                    put_str(out, k);
                }
            }
            Request::MultiSet { pairs } => {
                // Written as int64_t by the client (`TCPStore::multiSet`); same bytes as u64.
                put_u64(out, pairs.len() as u64);
                for (k, v) in pairs {
                    put_str(out, k);
                    put_str(out, v);
                }
            }
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::Barrier { key, world_size } => {
                put_str(out, key);
                out.extend_from_slice(&world_size.to_le_bytes());
            }
        }
    }

    /// This request's wire bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// Outcome of trying to decode one request from the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A whole request, and how many bytes of the buffer it used.
    Complete { request: Request, consumed: usize },
    /// More bytes are needed; nothing was consumed.
    Incomplete,
}

/// Why a byte stream is not a valid request. Every variant closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("key of {len} bytes exceeds the limit of {limit}")]
    KeyTooLong { len: u64, limit: u64 },
    #[error("value of {len} bytes exceeds the limit of {limit}")]
    ValueTooLong { len: u64, limit: u64 },
    #[error("{count} keys in one request exceed the limit of {limit}")]
    TooManyKeys { count: u64, limit: u64 },
    #[error("request of at least {len} bytes exceeds the limit of {limit}")]
    RequestTooLong { len: u64, limit: u64 },
}

/// Decodes one request from the front of `buf`. Returns `Incomplete` if `buf` holds only a prefix
/// of a valid request; an error as soon as the bytes seen cannot start a valid request.
pub fn decode_request(buf: &[u8], limits: &Limits) -> Result<Decoded, ProtocolError> {
    let mut r = Reader {
        buf,
        pos: 0,
        limits,
    };
    match r.request() {
        Ok(request) => Ok(Decoded::Complete {
            request,
            consumed: r.pos,
        }),
        Err(Stop::Incomplete) => Ok(Decoded::Incomplete),
        Err(Stop::Invalid(e)) => Err(e),
    }
}

enum Stop {
    Incomplete,
    Invalid(ProtocolError),
}

impl From<ProtocolError> for Stop {
    fn from(e: ProtocolError) -> Self {
        Stop::Invalid(e)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a Limits,
}

impl Reader<'_> {
    fn take(&mut self, n: u64) -> Result<&[u8], Stop> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.limits.max_request_len {
            return Err(ProtocolError::RequestTooLong {
                len: end,
                limit: self.limits.max_request_len,
            }
            .into());
        }
        if end > self.buf.len() as u64 {
            return Err(Stop::Incomplete);
        }
        let start = self.pos;
        // Cannot truncate: end <= buf.len().
        self.pos = end as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn key(&mut self) -> Result<Vec<u8>, Stop> {
        let len = self.u64()?;
        if len > self.limits.max_key_len {
            return Err(ProtocolError::KeyTooLong {
                len,
                limit: self.limits.max_key_len,
            }
            .into());
        }
        Ok(self.take(len)?.to_vec())
    }

    fn value(&mut self) -> Result<Vec<u8>, Stop> {
        let len = self.u64()?;
        if len > self.limits.max_value_len {
            return Err(ProtocolError::ValueTooLong {
                len,
                limit: self.limits.max_value_len,
            }
            .into());
        }
        Ok(self.take(len)?.to_vec())
    }

    fn count(&mut self) -> Result<u64, Stop> {
        let count = self.u64()?;
        if count > self.limits.max_keys_per_request {
            return Err(ProtocolError::TooManyKeys {
                count,
                limit: self.limits.max_keys_per_request,
            }
            .into());
        }
        Ok(count)
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, Stop> {
        let n = self.count()?;
        // Capacity bounded by what the buffer could hold (8 bytes per key at least), so a large
        // announced count cannot allocate ahead of its bytes.
        let mut keys = Vec::with_capacity(bounded_capacity(n, self.buf.len() - self.pos, 8));
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }

    fn request(&mut self) -> Result<Request, Stop> {
        let op = self.u8()?;
        let qt = QueryType::from_u8(op).ok_or(ProtocolError::UnknownOpcode(op))?;
        Ok(match qt {
            QueryType::Validate => Request::Validate { magic: self.u32()? },
            QueryType::Set => Request::Set {
                key: self.key()?,
                value: self.value()?,
            },
            QueryType::CompareSet => Request::CompareSet {
                key: self.key()?,
                expected: self.value()?,
                desired: self.value()?,
            },
            QueryType::Get => Request::Get { key: self.key()? },
            QueryType::Add => Request::Add {
                key: self.key()?,
                delta: self.i64()?,
            },
            QueryType::Check => Request::Check { keys: self.keys()? },
            QueryType::Wait => Request::Wait { keys: self.keys()? },
            QueryType::GetNumKeys => Request::GetNumKeys,
            QueryType::DeleteKey => Request::DeleteKey { key: self.key()? },
            QueryType::Append => Request::Append {
                key: self.key()?,
                value: self.value()?,
            },
            QueryType::MultiGet => Request::MultiGet { keys: self.keys()? },
            QueryType::MultiSet => {
                let n = self.count()?;
                let mut pairs =
                    Vec::with_capacity(bounded_capacity(n, self.buf.len() - self.pos, 16));
                for _ in 0..n {
                    let k = self.key()?;
                    let v = self.value()?;
                    pairs.push((k, v));
                }
                Request::MultiSet { pairs }
            }
            QueryType::CancelWait => Request::CancelWait,
            QueryType::Ping => Request::Ping { nonce: self.u32()? },
            QueryType::QueuePush => Request::QueuePush {
                key: self.key()?,
                value: self.value()?,
            },
            QueryType::QueuePop => Request::QueuePop { key: self.key()? },
            QueryType::QueueLen => Request::QueueLen { key: self.key()? },
            QueryType::ListKeys => Request::ListKeys,
            QueryType::Barrier => Request::Barrier {
                key: self.key()?,
                world_size: self.i64()?,
            },
        })
    }
}

fn bounded_capacity(n: u64, remaining: usize, min_item: usize) -> usize {
    let fit = remaining / min_item;
    usize::try_from(n).map_or(fit, |n| n.min(fit))
}

/// Appends a `u64` little-endian.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an `i64` little-endian.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a string: `u64` length then the bytes.
pub fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// Parses a stored counter like C++ `std::stoll(s)` (base 10): skips leading whitespace, takes
/// an optional sign and at least one digit, ignores anything after the digits. `None` when there
/// are no digits or the number overflows `i64` (where `stoll` throws, which PyTorch's server turns
/// into closing the connection).
pub fn parse_stoll(s: &[u8]) -> Option<i64> {
    let mut i = 0;
    // isspace in the C locale: space, \t, \n, \v, \f, \r.
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let mut neg = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        neg = s[i] == b'-';
        i += 1;
    }
    let start = i;
    let mut acc: i64 = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        let d = i64::from(s[i] - b'0');
        // Accumulate negatively so that i64::MIN parses.
        acc = acc.checked_mul(10)?.checked_sub(d)?;
        i += 1;
    }
    if i == start {
        return None;
    }
    if neg {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Request> {
        let k = b"/k1".to_vec();
        vec![
            Request::Validate {
                magic: VALIDATION_MAGIC,
            },
            Request::Set {
                key: k.clone(),
                value: b"v1".to_vec(),
            },
            Request::CompareSet {
                key: k.clone(),
                expected: vec![],
                desired: b"d".to_vec(),
            },
            Request::Get { key: k.clone() },
            Request::Add {
                key: k.clone(),
                delta: -2,
            },
            Request::Check {
                keys: vec![k.clone(), b"/x".to_vec()],
            },
            Request::Wait { keys: vec![] },
            Request::GetNumKeys,
            Request::DeleteKey { key: k.clone() },
            Request::Append {
                key: k.clone(),
                value: vec![0, 1, 2],
            },
            Request::MultiGet {
                keys: vec![k.clone(); 3],
            },
            Request::MultiSet {
                pairs: vec![(b"/m1".to_vec(), b"x".to_vec()), (b"/m2".to_vec(), vec![])],
            },
            Request::CancelWait,
            Request::Ping { nonce: 0xdead_beef },
            Request::QueuePush {
                key: b"/q".to_vec(),
                value: b"item1".to_vec(),
            },
            Request::QueuePop {
                key: b"/q".to_vec(),
            },
            Request::QueueLen {
                key: b"/q".to_vec(),
            },
            Request::ListKeys,
            Request::Barrier {
                key: b"/bar".to_vec(),
                world_size: 1,
            },
        ]
    }

    #[test]
    fn samples_cover_every_opcode() {
        let ops: Vec<QueryType> = samples().iter().map(Request::query_type).collect();
        assert_eq!(ops, QueryType::ALL.to_vec());
        for (i, q) in QueryType::ALL.iter().enumerate() {
            assert_eq!(*q as usize, i);
            assert_eq!(QueryType::from_u8(i as u8), Some(*q));
        }
        assert_eq!(QueryType::from_u8(19), None);
    }

    #[test]
    fn every_opcode_round_trips() {
        let limits = Limits::default();
        for req in samples() {
            let bytes = req.to_bytes();
            assert_eq!(
                decode_request(&bytes, &limits),
                Ok(Decoded::Complete {
                    request: req.clone(),
                    consumed: bytes.len()
                }),
                "{req:?}"
            );
        }
    }

    #[test]
    fn every_request_decodes_one_byte_at_a_time() {
        let limits = Limits::default();
        for req in samples() {
            let bytes = req.to_bytes();
            for cut in 0..bytes.len() {
                assert_eq!(
                    decode_request(&bytes[..cut], &limits),
                    Ok(Decoded::Incomplete),
                    "{req:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn pipelined_requests_decode_in_order() {
        let limits = Limits::default();
        let mut stream = Vec::new();
        for req in samples() {
            req.encode(&mut stream);
        }
        let mut pos = 0;
        let mut got = Vec::new();
        while pos < stream.len() {
            match decode_request(&stream[pos..], &limits).expect("valid") {
                Decoded::Complete { request, consumed } => {
                    got.push(request);
                    pos += consumed;
                }
                Decoded::Incomplete => panic!("incomplete at {pos}"),
            }
        }
        assert_eq!(got, samples());
    }

    /// Bytes observed on the wire with torch 2.15.0 (spec, section 2).
    #[test]
    fn observed_bytes() {
        let set = [
            1u8, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31, 2, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31,
        ];
        assert_eq!(
            Request::Set {
                key: b"/k1".to_vec(),
                value: b"v1".to_vec()
            }
            .to_bytes(),
            set
        );
        let validate_ping = [0u8, 0xce, 0xf7, 0x85, 0x3c, 0x0d, 1, 2, 3, 4];
        let mut both = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .to_bytes();
        Request::Ping { nonce: 0x0403_0201 }.encode(&mut both);
        assert_eq!(both, validate_ping);
        let add = Request::Add {
            key: b"/cnt".to_vec(),
            delta: -2,
        }
        .to_bytes();
        assert_eq!(
            &add[add.len() - 8..],
            &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        let barrier = Request::Barrier {
            key: b"/bar".to_vec(),
            world_size: 1,
        }
        .to_bytes();
        assert_eq!(barrier[0], 0x12);
    }

    #[test]
    fn limits_reject_before_payload_arrives() {
        let limits = Limits {
            max_key_len: 4,
            max_value_len: 8,
            max_keys_per_request: 2,
            max_request_len: 40,
        };
        // Key length field alone is enough to reject.
        let mut b = vec![QueryType::Get as u8];
        put_u64(&mut b, 5);
        assert_eq!(
            decode_request(&b, &limits),
            Err(ProtocolError::KeyTooLong { len: 5, limit: 4 })
        );
        let mut b = vec![QueryType::Set as u8];
        put_str(&mut b, b"k");
        put_u64(&mut b, 9);
        assert_eq!(
            decode_request(&b, &limits),
            Err(ProtocolError::ValueTooLong { len: 9, limit: 8 })
        );
        let mut b = vec![QueryType::Wait as u8];
        put_u64(&mut b, 3);
        assert_eq!(
            decode_request(&b, &limits),
            Err(ProtocolError::TooManyKeys { count: 3, limit: 2 })
        );
        let mut b = vec![QueryType::MultiSet as u8];
        put_u64(&mut b, 2);
        put_str(&mut b, b"k");
        put_u64(&mut b, 8);
        b.extend_from_slice(&[0; 8]);
        put_str(&mut b, b"k");
        put_u64(&mut b, 8);
        assert!(matches!(
            decode_request(&b, &limits),
            Err(ProtocolError::RequestTooLong { .. })
        ));
        // At the limits exactly: fine.
        let req = Request::Set {
            key: b"kkkk".to_vec(),
            value: vec![7; 8],
        };
        assert!(matches!(
            decode_request(&req.to_bytes(), &limits),
            Ok(Decoded::Complete { .. })
        ));
        assert_eq!(
            decode_request(&[19], &limits),
            Err(ProtocolError::UnknownOpcode(19))
        );
    }

    #[test]
    fn stoll_table() {
        let table: &[(&[u8], Option<i64>)] = &[
            (b"0", Some(0)),
            (b"12", Some(12)),
            (b" 12x", Some(12)),
            (b"\t\n-7", Some(-7)),
            (b"+5", Some(5)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"9223372036854775808", None),
            (b"abc", None),
            (b"", None),
            (b"-", None),
            (b" ", None),
            (b"x1", None),
        ];
        for (s, want) in table {
            assert_eq!(parse_stoll(s), *want, "{:?}", String::from_utf8_lossy(s));
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let limits = Limits { max_key_len: 64, max_value_len: 64, max_keys_per_request: 8, max_request_len: 1024 };
            let mut pos = 0;
            while pos < bytes.len() {
                match decode_request(&bytes[pos..], &limits) {
                    Ok(Decoded::Complete { consumed, .. }) => { prop_assert!(consumed > 0); pos += consumed; }
                    _ => break,
                }
            }
        }

        #[test]
        fn mutated_requests_never_panic(idx in 0usize..19, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6), cut in any::<usize>()) {
            let limits = Limits::default();
            let mut bytes = samples()[idx].to_bytes();
            for (at, v) in flips { let n = bytes.len(); bytes[at % n] = v; }
            let cut = cut % (bytes.len() + 1);
            let _ = decode_request(&bytes[..cut], &limits);
            let _ = decode_request(&bytes, &limits);
        }

        #[test]
        fn stoll_matches_decimal_formatting(v in any::<i64>()) {
            prop_assert_eq!(parse_stoll(v.to_string().as_bytes()), Some(v));
        }
    }
}
