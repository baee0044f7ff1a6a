//! The wire codec's tests: every layout both ways, split anywhere, and the limits.

use super::decode::{Partial, FIRST_PAYLOAD_ALLOC};
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
