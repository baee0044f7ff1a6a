//! A minimal HTTP/1.x responder on the agent's tokio runtime, for `/metrics`, `/healthz` and the
//! health port: read one request head (bounded in size and time), answer, close.
//!
//! Hand-written instead of hyper: two GET endpoints with `Connection: close` need the request
//! line and nothing else, and a web framework would add far more code to the launcher than this
//! file. Every connection is its own task, so a slow client never holds up the agent.

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

/// Answers a request for `path`.
pub type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

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
    let listener = TcpListener::bind(addr).await?;
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
                let mut r = handler(&path);
                if method == "HEAD" {
                    r.body.clear();
                }
                r
            }
            Some(_) => text(405, "method not allowed\n"),
            None => text(400, "bad request\n"),
        },
        Ok(false) => text(431, "request header too large\n"),
        Err(_) => return,
    };
    let reason = match resp.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{}",
        resp.status,
        resp.content_type,
        resp.body.len(),
        resp.body
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
    }

    #[tokio::test]
    async fn serves_and_closes() {
        let handler: Handler = Arc::new(|p: &str| text(if p == "/" { 200 } else { 404 }, p));
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
        task.abort();
    }
}
