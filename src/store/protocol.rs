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
//! Length: about 900 lines before the tests, for one responsibility, the wire format in both
//! directions (every request layout, the resumable decoders, every reply layout); splitting it
//! would put the two halves of one layout in different files.

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

/// Decodes one request from the front of `buf` in one go (a fresh [`Decoder`]). Returns
/// `Incomplete` if `buf` holds only a prefix of a valid request; an error as soon as the bytes seen
/// cannot start a valid request. A server reading a stream keeps one [`Decoder`] instead, so that
/// a request arriving in many pieces is not parsed again from its start on every piece.
pub fn decode_request(buf: &[u8], limits: &Limits) -> Result<Decoded, ProtocolError> {
    let mut d = Decoder::new(*limits);
    match d.decode(buf)? {
        (consumed, Some(request)) => Ok(Decoded::Complete { request, consumed }),
        (_, None) => Ok(Decoded::Incomplete),
    }
}

/// One field of a message: a fixed-width integer, or a `u64` length followed by that many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    U8,
    U32,
    /// Any 8-byte integer (`i64` or `u64`); the caller reinterprets.
    I64,
    /// A key count, checked against `max_keys_per_request`.
    Count,
    /// A string checked against `max_key_len`.
    Key,
    /// A string checked against `max_value_len`.
    Value,
}

impl Field {
    /// Bytes of the fixed part (the length header for strings).
    fn width(self) -> usize {
        match self {
            Field::U8 => 1,
            Field::U32 => 4,
            Field::I64 | Field::Count | Field::Key | Field::Value => 8,
        }
    }
}

/// The fields that follow an opcode (requests) or make up a reply, as a function of what has been
/// read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Exactly these fields.
    Fixed(&'static [Field]),
    /// A [`Field::Count`] `n`, then `n` times these fields.
    Counted(&'static [Field]),
    /// `n` values (MULTI_GET's reply; the count is known from the request).
    Values(u64),
    /// QUEUE_POP's reply: an `i64` length before the pop, then a value if it was positive.
    QueuePop,
}

impl Plan {
    /// The next field, given the integers and strings read so far; `None` when complete.
    fn next(self, nums: &[u64], strs: usize) -> Option<Field> {
        let strs = strs as u64;
        match self {
            Plan::Fixed(fields) => fields.get(nums.len() + strs as usize).copied(),
            Plan::Counted(item) => match nums.first() {
                None => Some(Field::Count),
                // The count is bounded by the limits, so the product cannot overflow in practice;
                // saturate anyway.
                Some(&n) => (strs < n.saturating_mul(item.len() as u64))
                    .then(|| item[(strs % item.len() as u64) as usize]),
            },
            Plan::Values(n) => (strs < n).then_some(Field::Value),
            Plan::QueuePop => match nums.first() {
                None => Some(Field::I64),
                Some(&len) => (strs == 0 && (len as i64) > 0).then_some(Field::Value),
            },
        }
    }
}

/// The request layout after each opcode (spec section 2).
fn request_plan(op: QueryType) -> Plan {
    use Field::*;
    match op {
        QueryType::Validate | QueryType::Ping => Plan::Fixed(&[U32]),
        QueryType::Set | QueryType::Append | QueryType::QueuePush => Plan::Fixed(&[Key, Value]),
        QueryType::CompareSet => Plan::Fixed(&[Key, Value, Value]),
        QueryType::Get | QueryType::DeleteKey | QueryType::QueuePop | QueryType::QueueLen => {
            Plan::Fixed(&[Key])
        }
        QueryType::Add | QueryType::Barrier => Plan::Fixed(&[Key, I64]),
        QueryType::Check | QueryType::Wait | QueryType::MultiGet => Plan::Counted(&[Key]),
        QueryType::MultiSet => Plan::Counted(&[Key, Value]),
        QueryType::GetNumKeys | QueryType::CancelWait | QueryType::ListKeys => Plan::Fixed(&[]),
    }
}

/// Fixed bytes seen so far of the field being read, or the payload of the string being read.
#[derive(Debug, Default)]
enum Partial {
    /// Between fields.
    #[default]
    Idle,
    Fixed {
        field: Field,
        buf: [u8; 8],
        have: usize,
    },
    Payload {
        data: Vec<u8>,
        len: usize,
    },
}

/// First allocation for a string payload; it then grows with the bytes that arrive (never ahead of
/// them), so an announced length costs nothing until its bytes are there.
const FIRST_PAYLOAD_ALLOC: usize = 4096;

/// The resumable field reader shared by requests and replies: the fields of one message read so
/// far, plus the partial field. Every input byte is looked at once.
#[derive(Debug, Default)]
struct Fields {
    nums: Vec<u64>,
    strs: Vec<Vec<u8>>,
    partial: Partial,
    /// Bytes of this message consumed so far (the opcode included, for requests).
    len: u64,
}

impl Fields {
    /// Reads fields of `plan` from `input`. Returns how many bytes were used and whether the
    /// message is complete; bytes after the end of the message are left alone.
    fn feed(
        &mut self,
        plan: Plan,
        input: &[u8],
        limits: &Limits,
    ) -> Result<(usize, bool), ProtocolError> {
        let mut pos = 0;
        loop {
            if matches!(self.partial, Partial::Idle) {
                match plan.next(&self.nums, self.strs.len()) {
                    None => return Ok((pos, true)),
                    Some(field) => {
                        self.partial = Partial::Fixed {
                            field,
                            buf: [0; 8],
                            have: 0,
                        }
                    }
                }
            }
            if pos == input.len() {
                return Ok((pos, false));
            }
            let rest = &input[pos..];
            match &mut self.partial {
                Partial::Idle => unreachable!("a field was started above"),
                Partial::Fixed { field, buf, have } => {
                    let field = *field;
                    let n = (field.width() - *have).min(rest.len());
                    check_total(self.len + n as u64, limits)?;
                    buf[*have..*have + n].copy_from_slice(&rest[..n]);
                    *have += n;
                    pos += n;
                    self.len += n as u64;
                    if *have == field.width() {
                        let v = u64::from_le_bytes(*buf);
                        self.partial = Partial::Idle;
                        self.fixed_done(field, v, limits)?;
                    }
                }
                Partial::Payload { data, len } => {
                    let n = (*len - data.len()).min(rest.len());
                    let need = data.len() + n;
                    if need > data.capacity() {
                        // Double, but never beyond the announced length: capacity stays within
                        // twice what arrived, and copying stays linear.
                        let target = need.max(data.capacity() * 2).min(*len);
                        data.reserve_exact(target - data.len());
                    }
                    data.extend_from_slice(&rest[..n]);
                    pos += n;
                    self.len += n as u64;
                    if data.len() == *len {
                        let data = std::mem::take(data);
                        self.partial = Partial::Idle;
                        self.strs.push(data);
                    }
                }
            }
        }
    }

    /// A fixed-width field is complete: record the number, or start the string it announces.
    fn fixed_done(&mut self, field: Field, v: u64, limits: &Limits) -> Result<(), ProtocolError> {
        let limit = match field {
            Field::U8 | Field::U32 | Field::I64 => {
                self.nums.push(v);
                return Ok(());
            }
            Field::Count => {
                if v > limits.max_keys_per_request {
                    return Err(ProtocolError::TooManyKeys {
                        count: v,
                        limit: limits.max_keys_per_request,
                    });
                }
                self.nums.push(v);
                return Ok(());
            }
            Field::Key => limits.max_key_len,
            Field::Value => limits.max_value_len,
        };
        if v > limit {
            return Err(if field == Field::Key {
                ProtocolError::KeyTooLong { len: v, limit }
            } else {
                ProtocolError::ValueTooLong { len: v, limit }
            });
        }
        // Refuse an oversized request on its length field, before its payload is buffered.
        check_total(self.len.saturating_add(v), limits)?;
        if v == 0 {
            self.strs.push(Vec::new());
        } else {
            // v <= a limit that the caller keeps within memory; usize is 64-bit where this runs.
            let len = usize::try_from(v).unwrap_or(usize::MAX);
            self.partial = Partial::Payload {
                data: Vec::with_capacity(len.min(FIRST_PAYLOAD_ALLOC)),
                len,
            };
        }
        Ok(())
    }

    /// Bytes of the message held so far (consumed and kept until the message is complete).
    fn held(&self) -> u64 {
        self.len
    }
}

fn check_total(len: u64, limits: &Limits) -> Result<(), ProtocolError> {
    if len > limits.max_request_len {
        return Err(ProtocolError::RequestTooLong {
            len,
            limit: limits.max_request_len,
        });
    }
    Ok(())
}

/// Incremental request decoder for one connection. [`Decoder::decode`] takes whatever bytes have
/// arrived; a partial request is kept inside the decoder (its strings are copied out of the input
/// once, as they arrive), and the next call resumes at the exact byte where the previous one
/// stopped, so a request costs O(its length) however it is split. Limits are checked as soon as
/// a length field is complete, so an oversized request is refused before its payload is buffered.
/// After an error the decoder is spent (the connection closes).
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    op: Option<QueryType>,
    fields: Fields,
    examined: u64,
}

impl Decoder {
    /// A decoder at a request boundary.
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits,
            op: None,
            fields: Fields::default(),
            examined: 0,
        }
    }

    /// Consumes bytes from the front of `input` until one request is complete (returned with the
    /// bytes used) or `input` is used up (`None`; every byte consumed and kept). Call again with
    /// the rest of `input` after a complete request.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Request>), ProtocolError> {
        let mut pos = 0;
        let op = match self.op {
            Some(op) => op,
            None => {
                let Some(&b) = input.first() else {
                    return Ok((0, None));
                };
                let op = QueryType::from_u8(b).ok_or(ProtocolError::UnknownOpcode(b))?;
                check_total(1, &self.limits)?;
                pos = 1;
                self.examined += 1;
                self.fields.len = 1;
                self.op = Some(op);
                op
            }
        };
        let (n, done) = self
            .fields
            .feed(request_plan(op), &input[pos..], &self.limits)?;
        pos += n;
        self.examined += n as u64;
        if !done {
            return Ok((pos, None));
        }
        let fields = std::mem::take(&mut self.fields);
        self.op = None;
        Ok((pos, Some(build_request(op, fields))))
    }

    /// True between requests (no byte of the next request seen yet).
    pub fn at_boundary(&self) -> bool {
        self.op.is_none()
    }

    /// Bytes of the partial request held (0 at a boundary): what this connection buffers.
    pub fn buffered(&self) -> u64 {
        if self.op.is_some() {
            self.fields.held()
        } else {
            0
        }
    }

    /// Input bytes this decoder has looked at over its life (each byte once): the work measure
    /// that keeps decoding linear in the bytes received.
    pub fn examined(&self) -> u64 {
        self.examined
    }
}

/// Assembles a complete request from its fields (laid out by `request_plan`).
fn build_request(op: QueryType, f: Fields) -> Request {
    let nums = f.nums;
    let mut strs = f.strs.into_iter();
    let mut s = || strs.next().unwrap_or_default();
    let num = |i: usize| nums.get(i).copied().unwrap_or(0);
    match op {
        QueryType::Validate => Request::Validate {
            magic: num(0) as u32,
        },
        QueryType::Ping => Request::Ping {
            nonce: num(0) as u32,
        },
        QueryType::Set => Request::Set {
            key: s(),
            value: s(),
        },
        QueryType::Append => Request::Append {
            key: s(),
            value: s(),
        },
        QueryType::QueuePush => Request::QueuePush {
            key: s(),
            value: s(),
        },
        QueryType::CompareSet => Request::CompareSet {
            key: s(),
            expected: s(),
            desired: s(),
        },
        QueryType::Get => Request::Get { key: s() },
        QueryType::DeleteKey => Request::DeleteKey { key: s() },
        QueryType::QueuePop => Request::QueuePop { key: s() },
        QueryType::QueueLen => Request::QueueLen { key: s() },
        QueryType::Add => Request::Add {
            key: s(),
            delta: num(0) as i64,
        },
        QueryType::Barrier => Request::Barrier {
            key: s(),
            world_size: num(0) as i64,
        },
        QueryType::Check => Request::Check {
            keys: strs.collect(),
        },
        QueryType::Wait => Request::Wait {
            keys: strs.collect(),
        },
        QueryType::MultiGet => Request::MultiGet {
            keys: strs.collect(),
        },
        QueryType::MultiSet => {
            let mut pairs = Vec::with_capacity(strs.len() / 2);
            while let Some(k) = strs.next() {
                pairs.push((k, strs.next().unwrap_or_default()));
            }
            Request::MultiSet { pairs }
        }
        QueryType::GetNumKeys => Request::GetNumKeys,
        QueryType::CancelWait => Request::CancelWait,
        QueryType::ListKeys => Request::ListKeys,
    }
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

    /// Feeds `bytes` to one decoder in pieces of `step` bytes; returns the requests it produced.
    fn feed_in_pieces(d: &mut Decoder, bytes: &[u8], step: usize) -> Vec<Request> {
        let mut got = Vec::new();
        for piece in bytes.chunks(step) {
            let mut pos = 0;
            while pos < piece.len() {
                let (n, req) = d.decode(&piece[pos..]).expect("valid");
                pos += n;
                got.extend(req);
            }
        }
        got
    }

    #[test]
    fn pipelined_stream_fed_one_byte_at_a_time() {
        let mut stream = Vec::new();
        for req in samples() {
            req.encode(&mut stream);
        }
        for step in [1, 2, 3, 7, 64, stream.len()] {
            let mut d = Decoder::new(Limits::default());
            assert_eq!(
                feed_in_pieces(&mut d, &stream, step),
                samples(),
                "step {step}"
            );
            assert!(d.at_boundary());
            assert_eq!(d.buffered(), 0);
            assert_eq!(d.examined(), stream.len() as u64, "step {step}");
        }
    }

    /// The slow client: a big MULTI_SET arriving a few bytes at a time. The decoder looks
    /// at every byte exactly once (the old decoder re-parsed the whole buffered prefix on every
    /// read: quadratic), and what it holds is exactly the bytes of the partial request.
    #[test]
    fn decoding_work_is_linear_in_bytes_received() {
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..2000)
            .map(|i| (format!("/k{i}").into_bytes(), vec![i as u8; 37]))
            .collect();
        pairs.push((b"/big".to_vec(), vec![9; 1 << 20]));
        let req = Request::MultiSet { pairs };
        let bytes = req.to_bytes();
        for step in [1usize, 16] {
            let mut d = Decoder::new(Limits::default());
            let mut got = None;
            for (i, piece) in bytes.chunks(step).enumerate() {
                let (n, r) = d.decode(piece).expect("valid");
                assert_eq!(n, piece.len());
                assert!(d.examined() <= ((i + 1) * step) as u64);
                if r.is_none() {
                    assert_eq!(d.buffered(), d.examined());
                }
                got = r;
            }
            assert_eq!(got.as_ref(), Some(&req));
            assert_eq!(d.examined(), bytes.len() as u64);
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn announced_length_allocates_only_with_its_bytes() {
        let mut b = vec![QueryType::Set as u8];
        put_str(&mut b, b"/k");
        put_u64(&mut b, 8 << 20);
        b.extend_from_slice(&[1; 10]);
        let mut d = Decoder::new(Limits::default());
        assert_eq!(d.decode(&b), Ok((b.len(), None)));
        let Partial::Payload { data, len } = &d.fields.partial else {
            panic!("expected a partial payload");
        };
        assert_eq!(*len, 8 << 20);
        assert!(
            data.capacity() <= FIRST_PAYLOAD_ALLOC,
            "{}",
            data.capacity()
        );
        // Growing never goes past the announced length.
        let mut d = Decoder::new(Limits::default());
        let mut b = vec![QueryType::Set as u8];
        put_str(&mut b, b"/k");
        put_u64(&mut b, 10_000);
        b.extend_from_slice(&[1; 9_999]);
        for piece in b.chunks(1000) {
            d.decode(piece).expect("valid");
        }
        let Partial::Payload { data, .. } = &d.fields.partial else {
            panic!("expected a partial payload");
        };
        assert!(data.capacity() <= 10_000, "{}", data.capacity());
    }

    /// Default caps are PyTorch's libuv limits; a request is bounded by the largest one-key request
    /// they allow.
    #[test]
    fn default_caps_match_pytorch() {
        let limits = Limits::default();
        assert_eq!(limits.max_key_len, 8192);
        assert_eq!(limits.max_value_len, 8 << 20);
        assert_eq!(limits.max_keys_per_request, 131_072);
        let decode_all = |b: &[u8]| {
            let mut d = Decoder::new(limits);
            d.decode(b).map(|(_, r)| r)
        };
        // Largest COMPARE_SET: accepted.
        let cas = Request::CompareSet {
            key: vec![b'k'; 8192],
            expected: vec![1; 8 << 20],
            desired: vec![2; 8 << 20],
        }
        .to_bytes();
        assert_eq!(cas.len() as u64, limits.max_request_len);
        assert!(matches!(decode_all(&cas), Ok(Some(_))));
        // One more key byte or value byte: refused on the length field alone.
        let mut b = vec![QueryType::Get as u8];
        put_u64(&mut b, 8193);
        assert_eq!(
            decode_all(&b),
            Err(ProtocolError::KeyTooLong {
                len: 8193,
                limit: 8192
            })
        );
        let mut b = vec![QueryType::Set as u8];
        put_str(&mut b, b"/k");
        put_u64(&mut b, (8 << 20) + 1);
        assert_eq!(
            decode_all(&b),
            Err(ProtocolError::ValueTooLong {
                len: (8 << 20) + 1,
                limit: 8 << 20
            })
        );
        let mut b = vec![QueryType::Wait as u8];
        put_u64(&mut b, 131_072);
        assert_eq!(decode_all(&b), Ok(None));
        let mut b = vec![QueryType::Wait as u8];
        put_u64(&mut b, 131_073);
        assert!(matches!(
            decode_all(&b),
            Err(ProtocolError::TooManyKeys { .. })
        ));
        // A MULTI_SET of three maximal values exceeds the total on the third length field.
        let mut b = vec![QueryType::MultiSet as u8];
        put_u64(&mut b, 3);
        for _ in 0..2 {
            put_str(&mut b, b"/k");
            put_str(&mut b, &vec![0; 8 << 20]);
        }
        put_str(&mut b, b"/k");
        put_u64(&mut b, 8 << 20);
        assert!(matches!(
            decode_all(&b),
            Err(ProtocolError::RequestTooLong { .. })
        ));
    }

    fn reply_samples() -> Vec<Reply> {
        vec![
            Reply::Byte(CHECK_NOT_READY),
            Reply::U32(0xdead_beef),
            Reply::I64(-5),
            Reply::Str(b"value".to_vec()),
            Reply::Str(vec![]),
            Reply::Strs(vec![b"a".to_vec(), vec![], b"ccc".to_vec()]),
            Reply::Strs(vec![]),
            Reply::QueuePop {
                len_before: 0,
                value: None,
            },
            Reply::QueuePop {
                len_before: 2,
                value: Some(b"item1".to_vec()),
            },
            Reply::ListKeys(vec![b"/a".to_vec(), b"init/".to_vec()]),
            Reply::ListKeys(vec![]),
        ]
    }

    #[test]
    fn every_reply_round_trips_in_any_split_and_leaves_what_follows() {
        for reply in reply_samples() {
            let mut bytes = Vec::new();
            reply.encode(&mut bytes);
            let len = bytes.len();
            bytes.extend_from_slice(&[0xaa, 0xbb]);
            // Whole: consumes exactly the reply.
            let mut d = ReplyDecoder::new(reply.shape(), Limits::REPLY);
            assert_eq!(
                d.decode(&bytes),
                Ok((len, Some(reply.clone()))),
                "{reply:?}"
            );
            // One byte at a time.
            let mut d = ReplyDecoder::new(reply.shape(), Limits::REPLY);
            let mut got = None;
            for (i, b) in bytes[..len].iter().enumerate() {
                let (n, r) = d.decode(std::slice::from_ref(b)).expect("valid");
                assert_eq!(n, 1);
                assert_eq!(r.is_some(), i + 1 == len, "{reply:?} at {i}");
                got = r.or(got);
            }
            if len == 0 {
                got = d.decode(&[]).expect("valid").1;
            }
            assert_eq!(got, Some(reply.clone()));
        }
    }

    /// Replies as observed with torch 2.15.0 (spec section 2).
    #[test]
    fn observed_reply_bytes() {
        let enc = |r: Reply| {
            let mut b = Vec::new();
            r.encode(&mut b);
            b
        };
        assert_eq!(enc(Reply::I64(5)), [5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            enc(Reply::Str(b"v1".to_vec())),
            [2, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31]
        );
        assert_eq!(
            enc(Reply::QueuePop {
                len_before: 1,
                value: Some(b"item1".to_vec())
            }),
            [1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, b'i', b't', b'e', b'm', b'1']
        );
        assert_eq!(
            &enc(Reply::ListKeys(vec![b"/m2".to_vec()]))[..8],
            &[1, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn reply_shape_of_every_request() {
        let shapes: Vec<Option<ReplyShape>> = samples().iter().map(Request::reply_shape).collect();
        use ReplyShape::*;
        assert_eq!(
            shapes,
            vec![
                None,
                None,
                Some(Str),
                Some(Str),
                Some(I64),
                Some(Byte),
                Some(Byte),
                Some(I64),
                Some(I64),
                None,
                Some(Strs(3)),
                None,
                Some(Byte),
                Some(U32),
                None,
                Some(QueuePop),
                Some(I64),
                Some(ListKeys),
                Some(Byte),
            ]
        );
    }

    #[test]
    fn reply_limits_refuse_absurd_lengths() {
        let mut b = Vec::new();
        put_u64(&mut b, (1 << 31) + 1);
        let mut d = ReplyDecoder::new(ReplyShape::Str, Limits::REPLY);
        assert!(matches!(
            d.decode(&b),
            Err(ProtocolError::ValueTooLong { .. })
        ));
        let mut d = ReplyDecoder::new(ReplyShape::ListKeys, Limits::REPLY);
        assert!(matches!(
            d.decode(&(-1i64).to_le_bytes()),
            Err(ProtocolError::TooManyKeys { .. })
        ));
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
        fn any_split_decodes_like_whole(cuts in proptest::collection::vec(1usize..40, 1..40)) {
            let mut stream = Vec::new();
            for req in samples() {
                req.encode(&mut stream);
            }
            let mut d = Decoder::new(Limits::default());
            let mut got = Vec::new();
            let mut at = 0;
            let mut cuts = cuts.into_iter().cycle();
            while at < stream.len() {
                let end = (at + cuts.next().unwrap_or(1)).min(stream.len());
                let mut pos = at;
                while pos < end {
                    let (n, r) = d.decode(&stream[pos..end]).expect("valid");
                    pos += n;
                    got.extend(r);
                }
                at = end;
            }
            prop_assert_eq!(got, samples());
            prop_assert_eq!(d.examined(), stream.len() as u64);
        }

        #[test]
        fn stoll_matches_decimal_formatting(v in any::<i64>()) {
            prop_assert_eq!(parse_stoll(v.to_string().as_bytes()), Some(v));
        }
    }
}
