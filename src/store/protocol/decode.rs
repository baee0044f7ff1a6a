//! The resumable request decoder: a request's fields read as they arrive, limits checked as
//! soon as a length is known, the partial request kept where it stopped (O(its length) however
//! finely it is split). The field reader ([`Fields`] following a [`Plan`]) is the client's
//! reply decoder's too.

use super::{Decoded, Limits, ProtocolError, QueryType, Request};

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
pub(super) enum Field {
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
    pub(super) fn width(self) -> usize {
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
pub(super) enum Plan {
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
    pub(super) fn next(self, nums: &[u64], strs: usize) -> Option<Field> {
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
pub(super) enum Partial {
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
pub(super) const FIRST_PAYLOAD_ALLOC: usize = 4096;

/// The resumable field reader shared by requests and replies: the fields of one message read so
/// far, plus the partial field. Every input byte is looked at once.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) nums: Vec<u64>,
    pub(super) strs: Vec<Vec<u8>>,
    pub(super) partial: Partial,
    /// Bytes of this message consumed so far (the opcode included, for requests).
    pub(super) len: u64,
}

impl Fields {
    /// Reads fields of `plan` from `input`. Returns how many bytes were used and whether the
    /// message is complete; bytes after the end of the message are left alone.
    pub(super) fn feed(
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
    pub(super) fn fixed_done(
        &mut self,
        field: Field,
        v: u64,
        limits: &Limits,
    ) -> Result<(), ProtocolError> {
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
    pub(super) fn held(&self) -> u64 {
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
    pub(super) fields: Fields,
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
