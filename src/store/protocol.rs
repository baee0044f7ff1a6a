//! The TCPStore wire codec: query types, the validation magic, request encoding and decoding, and
//! reply encoding and decoding. Pure functions and state machines over byte slices; no I/O.
//!
//! Layouts follow PyTorch 2.15.0 (`torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp` for the
//! enums, `TCPStore.cpp` for the client's encoding, `TCPStoreLibUvBackend.cpp` for the server's
//! parsing and limits). Integers are raw host-order copies of the C++ values in PyTorch; every
//! platform PyTorch supports is little-endian, so this codec reads and writes little-endian.
//! Lengths and counts are `u64`; strings are `u64 len` + bytes.
//!
//! Decoding is incremental and resumable: a [`Decoder`] (requests, the server's side) or a
//! [`ReplyDecoder`] (replies, the client's side) takes bytes as they arrive, keeps the partial
//! message and continues at the byte where it stopped, so a message costs O(its length) however
//! finely it is split. Limits are checked as soon as a length field is read, so an oversized
//! request is rejected before its payload is buffered. Replies are one [`Reply`] type: the server
//! encodes it and the client decodes it, so the two sides cannot drift apart.
//!
//! Files: this one holds the opcodes, the limits, the [`Request`] and [`Reply`] layouts with their
//! encoders and the reply decoder; `protocol/decode.rs` the resumable request decoder (the
//! server's side, where untrusted bytes arrive), which follows the same layouts field by field.

use thiserror::Error;

mod decode;

pub use decode::{decode_request, Decoder};
use decode::{Field, Fields, Plan};

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

    /// The largest request PyTorch's server accepts that names one key: a COMPARE_SET with a
    /// maximal key and maximal expected and desired values (opcode + 3 length fields + payloads).
    pub const fn largest_single_key_request(&self) -> u64 {
        1 + 3 * 8 + self.max_key_len + 2 * self.max_value_len
    }

    /// What the client accepts in a reply: strings up to 2 GiB, LIST_KEYS counts up to 2^28
    /// (guards against a misbehaving server, not a protocol limit).
    pub const REPLY: Limits = Limits {
        max_key_len: 1 << 31,
        max_value_len: 1 << 31,
        max_keys_per_request: 1 << 28,
        max_request_len: u64::MAX,
    };
}

impl Default for Limits {
    /// PyTorch's per-field limits, and a request bounded by the largest one-key request they allow
    /// (about 16 MiB): every request PyTorch's client sends for one key passes; only a MULTI_SET
    /// of more than that in total is refused (PyTorch would buffer up to 131072 x 8 MiB).
    fn default() -> Self {
        Limits {
            max_request_len: Limits::PYTORCH.largest_single_key_request(),
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

/// Why a byte stream is not a valid request (or reply). Every variant closes the connection.
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

/// The layout of a reply, known to the client from the request it sent
/// ([`Request::reply_shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyShape {
    /// One byte: CHECK, WAIT, BARRIER, CANCEL_WAIT.
    Byte,
    /// PING's echoed nonce.
    U32,
    /// ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN.
    I64,
    /// GET, COMPARE_SET.
    Str,
    /// MULTI_GET: this many strings, no count on the wire.
    Strs(u64),
    /// QUEUE_POP: `i64` length before the pop, then the value if it was positive.
    QueuePop,
    /// LIST_KEYS: `i64` count, then that many strings.
    ListKeys,
}

impl ReplyShape {
    fn plan(self) -> Plan {
        use Field::*;
        match self {
            ReplyShape::Byte => Plan::Fixed(&[U8]),
            ReplyShape::U32 => Plan::Fixed(&[U32]),
            ReplyShape::I64 => Plan::Fixed(&[I64]),
            ReplyShape::Str => Plan::Fixed(&[Value]),
            ReplyShape::Strs(n) => Plan::Values(n),
            ReplyShape::QueuePop => Plan::QueuePop,
            ReplyShape::ListKeys => Plan::Counted(&[Value]),
        }
    }
}

/// One reply, as the server encodes it and the client decodes it (one codec for both sides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// CHECK (`CHECK_READY`/`CHECK_NOT_READY`), WAIT/BARRIER (`STOP_WAITING`), CANCEL_WAIT
    /// (`WAIT_CANCELED`).
    Byte(u8),
    /// PING.
    U32(u32),
    /// ADD, GETNUMKEYS, DELETE_KEY (0/1), QUEUE_LEN.
    I64(i64),
    /// GET, COMPARE_SET.
    Str(Vec<u8>),
    /// MULTI_GET.
    Strs(Vec<Vec<u8>>),
    /// QUEUE_POP: the queue length before the pop and the popped value (present iff the length
    /// was positive).
    QueuePop {
        len_before: i64,
        value: Option<Vec<u8>>,
    },
    /// LIST_KEYS.
    ListKeys(Vec<Vec<u8>>),
}

impl Reply {
    /// Appends this reply's wire bytes to `out`, as PyTorch's servers lay them out.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Byte(b) => out.push(*b),
            Reply::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Reply::I64(v) => put_i64(out, *v),
            Reply::Str(s) => put_str(out, s),
            Reply::Strs(v) => v.iter().for_each(|s| put_str(out, s)),
            Reply::QueuePop { len_before, value } => {
                put_i64(out, *len_before);
                if let Some(v) = value {
                    put_str(out, v);
                }
            }
            Reply::ListKeys(keys) => {
                put_i64(out, keys.len() as i64);
                keys.iter().for_each(|k| put_str(out, k));
            }
        }
    }

    /// The shape a client would expect for this reply.
    pub fn shape(&self) -> ReplyShape {
        match self {
            Reply::Byte(_) => ReplyShape::Byte,
            Reply::U32(_) => ReplyShape::U32,
            Reply::I64(_) => ReplyShape::I64,
            Reply::Str(_) => ReplyShape::Str,
            Reply::Strs(v) => ReplyShape::Strs(v.len() as u64),
            Reply::QueuePop { .. } => ReplyShape::QueuePop,
            Reply::ListKeys(_) => ReplyShape::ListKeys,
        }
    }
}

impl Request {
    /// The reply this request gets: `None` for SET, APPEND, MULTI_SET, QUEUE_PUSH and VALIDATE;
    /// WAIT and BARRIER get their one byte later (deferred).
    pub fn reply_shape(&self) -> Option<ReplyShape> {
        Some(match self {
            Request::Validate { .. }
            | Request::Set { .. }
            | Request::Append { .. }
            | Request::MultiSet { .. }
            | Request::QueuePush { .. } => return None,
            Request::Check { .. }
            | Request::Wait { .. }
            | Request::Barrier { .. }
            | Request::CancelWait => ReplyShape::Byte,
            Request::Ping { .. } => ReplyShape::U32,
            Request::Add { .. }
            | Request::GetNumKeys
            | Request::DeleteKey { .. }
            | Request::QueueLen { .. } => ReplyShape::I64,
            Request::Get { .. } | Request::CompareSet { .. } => ReplyShape::Str,
            Request::MultiGet { keys } => ReplyShape::Strs(keys.len() as u64),
            Request::QueuePop { .. } => ReplyShape::QueuePop,
            Request::ListKeys => ReplyShape::ListKeys,
        })
    }
}

/// Incremental decoder of one reply of a known shape (the client's side of [`Reply`]). Like
/// [`Decoder`], it keeps a partial reply and resumes where it stopped.
#[derive(Debug)]
pub struct ReplyDecoder {
    shape: ReplyShape,
    limits: Limits,
    fields: Fields,
}

impl ReplyDecoder {
    /// A decoder for one reply of `shape`; strings and counts are bounded by `limits`
    /// (`max_value_len`, `max_keys_per_request`).
    pub fn new(shape: ReplyShape, limits: Limits) -> ReplyDecoder {
        ReplyDecoder {
            shape,
            limits,
            fields: Fields::default(),
        }
    }

    /// Consumes bytes from the front of `input` up to the end of the reply. Returns the bytes
    /// used and the reply once complete; bytes after it are left alone.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Reply>), ProtocolError> {
        let (n, done) = self.fields.feed(self.shape.plan(), input, &self.limits)?;
        if !done {
            return Ok((n, None));
        }
        let f = std::mem::take(&mut self.fields);
        let num = f.nums.first().copied().unwrap_or(0);
        let mut strs = f.strs;
        let reply = match self.shape {
            ReplyShape::Byte => Reply::Byte(num as u8),
            ReplyShape::U32 => Reply::U32(num as u32),
            ReplyShape::I64 => Reply::I64(num as i64),
            ReplyShape::Str => Reply::Str(strs.pop().unwrap_or_default()),
            ReplyShape::Strs(_) => Reply::Strs(strs),
            ReplyShape::QueuePop => Reply::QueuePop {
                len_before: num as i64,
                value: strs.pop(),
            },
            ReplyShape::ListKeys => Reply::ListKeys(strs),
        };
        Ok((n, Some(reply)))
    }
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
#[path = "protocol_tests.rs"]
mod tests;

/// A key no value is stored under: GET or COMPARE_SET of it answers the server's wall-clock time
/// (nanoseconds since the Unix epoch, decimal), so that an agent can measure its clock offset to
/// the store host from one round trip (issue 28's `clock` health check). A PyTorch store answers
/// it as any missing key. The server answers it (`server/conn.rs`).
pub const CLOCK_KEY: &str = "rdrun.clock";
