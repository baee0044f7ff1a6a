//! A minimal HTTP/1.x responder on the agent's tokio runtime, for `/metrics`, `/healthz` and the
//! health port: read one request head (bounded in size and time), answer, close.
//!
//! Hand-written instead of hyper: two GET endpoints with `Connection: close` need the request
//! line and the `Accept` header and nothing else, and a web framework would add far more code to
//! the launcher than this file. Every connection is its own task, so a slow client never holds up
//! the agent. The listener is bound like the store's (`store::server::bind_listener`): the
//! backlog from `somaxconn`, so a connection flood does not drop the SYNs of a health probe, and
//! `[::]` dual-stack.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// What a handler sees of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// The path, query string dropped.
    pub path: String,
    /// The `Accept` header's value, if any (several headers joined with `,`).
    pub accept: Option<String>,
}

/// Answers a request.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// The longest request head read; longer ones get 431.
const MAX_HEAD: usize = 8 * 1024;
/// A client has this long to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` now (so a bad address fails the launch before anything starts) and serves
/// until the task is aborted. Returns the bound address (port 0 = a free one) and the task.
pub async fn serve(
    addr: SocketAddr,
    handler: Handler,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = bind(addr)?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, handler.clone()));
                }
                Err(e) => {
                    tracing::debug!("http accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok((local, task))
}

/// A listener as the store binds one: backlog from `somaxconn` (the default 1024 of
/// `TcpListener::bind` let a flood of 2,000 connections queue a probe's SYN for seconds),
/// dual-stack for `[::]`.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::from_std(crate::store::server::bind_listener(addr)?)
}

async fn answer(mut stream: TcpStream, handler: Handler) {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return true;
            }
            if head.len() > MAX_HEAD {
                return false;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return !head.is_empty(),
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let resp = match read {
        Ok(true) => match request_path(&head) {
            Some((method, path)) if method == "GET" || method == "HEAD" => {
                let req = Request {
                    path,
                    accept: header(&head, "accept"),
                };
                (handler(&req), method == "HEAD")
            }
            Some(_) => (text(405, "method not allowed\n"), false),
            None => (text(400, "bad request\n"), false),
        },
        Ok(false) => (text(431, "request header too large\n"), false),
        Err(_) => return,
    };
    let (resp, head_only) = resp;
    let reason = match resp.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    // HEAD: the headers GET would send, Content-Length included (RFC 9110 9.3.2), no body.
    let out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{}",
        resp.status,
        resp.content_type,
        resp.body.len(),
        if head_only { "" } else { &resp.body }
    );
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A plain-text response.
pub fn text(status: u16, body: impl Into<String>) -> Response {
    Response {
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.into(),
    }
}

/// The method and path (query string dropped) of a request head.
fn request_path(head: &[u8]) -> Option<(String, String)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let method = parts.next()?.to_string();
    let target = parts.next()?;
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let path = target.split('?').next().unwrap_or("/").to_string();
    Some((method, path))
}

/// The value of header `name` (lower case) in a request head; repeated headers joined by `,`.
fn header(head: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let values: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            request_path(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(("GET".into(), "/metrics".into()))
        );
        assert_eq!(request_path(b"garbage\r\n\r\n"), None);
        let head = b"GET / HTTP/1.1\r\nHost: a\r\naccept: text/plain\r\nACCEPT: */*\r\n\r\n";
        assert_eq!(header(head, "accept").as_deref(), Some("text/plain,*/*"));
        assert_eq!(header(head, "host").as_deref(), Some("a"));
        assert_eq!(header(b"GET / HTTP/1.0\r\n\r\n", "accept"), None);
    }

    /// The backlog the kernel holds for the listener (TCP_INFO of a listening socket reports
    /// `sk_max_ack_backlog` in `tcpi_sacked`) is `somaxconn`'s, as the store's.
    #[tokio::test]
    async fn listen_backlog_is_the_stores() {
        use std::os::fd::AsRawFd;
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `info`, a live local of that size.
        let rc = unsafe {
            libc::getsockopt(
                l.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let want = crate::store::server::listen_backlog();
        assert_eq!(i64::from(info.tcpi_sacked), i64::from(want));
    }

    #[tokio::test]
    async fn serves_and_closes() {
        let handler: Handler =
            Arc::new(|r: &Request| text(if r.path == "/" { 200 } else { 404 }, r.path.clone()));
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), handler)
            .await
            .unwrap();
        for (path, want) in [("/", "200 OK"), ("/nope", "404 Not Found")] {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut got = String::new();
            s.read_to_string(&mut got).await.unwrap();
            assert!(got.starts_with(&format!("HTTP/1.1 {want}")), "{got}");
            assert!(got.ends_with(path), "{got}");
        }
        // HEAD: GET's Content-Length, no body.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"HEAD /nope HTTP/1.0\r\n\r\n").await.unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).await.unwrap();
        assert!(got.contains("\r\nContent-Length: 5\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\n"), "{got}");
        task.abort();
    }
}
