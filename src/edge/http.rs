//! HTTP/1.1 request framing for the ingest edge, sans-IO: parsing a request head into
//! byte ranges of the caller's read buffer, decoding chunked bodies incrementally, and
//! writing responses and JSON error bodies. The sockets, timeouts and buffers belong to
//! `edge::conn`; every refusal here is an [`HttpError`] with a status and a stable code.
//!
//! # Allocation
//!
//! Nothing here allocates per request once a connection's [`Head`] has grown to its
//! working size. The head stores ranges, not slices, so it borrows nothing and lives as
//! long as the connection. httparse needs a header array of `header_count_max + 1`
//! slots; rather than a fixed stack array (which would cap the configurable limit) the
//! `Head` keeps that array as a reusable `Vec` and hands httparse its spare capacity
//! (`parse_with_uninit_headers`, so nothing is initialised per call either).
//!
//! # Request smuggling defences
//!
//! Anything that two parsers could frame differently is refused rather than guessed:
//! Content-Length together with Transfer-Encoding (400), differing or non-numeric
//! Content-Length values (400), Transfer-Encoding in an HTTP/1.0 request (400), and any
//! Transfer-Encoding but exactly one `chunked` (501: RFC 9112 §6.1 answers a transfer
//! coding the server does not implement with 501). Chunk framing is strict: CRLF only,
//! no bare LF, hex sizes with overflow checks, bounded size and trailer lines.

use std::io::Write;
use std::ops::Range;

use thiserror::Error;

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Longest chunk-size line (size and extensions) accepted, in bytes.
const CHUNK_LINE_MAX: usize = 4096;

/// Most trailer bytes accepted after the last chunk; trailers are read and discarded,
/// so this only bounds the work a client can make us do.
const TRAILER_BYTES_MAX: usize = 8192;

/// The edge limits that framing enforces, copied from `config::Edge`.
#[derive(Debug, Clone)]
pub struct Limits {
    pub body_max_bytes: usize,
    pub header_count_max: usize,
    pub header_bytes_max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Post,
    Get,
    Head,
    Put,
    Delete,
    Patch,
    Options,
    Other,
}

impl Method {
    fn parse(text: &str) -> Method {
        // Methods are case-sensitive (RFC 9110 §9.1): `post` is not POST.
        match text {
            "POST" => Method::Post,
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// How the body that follows the head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (a request without Content-Length or Transfer-Encoding that may omit it).
    None,
    Length(usize),
    Chunked,
}

/// A parsed request head, as byte ranges into the caller's read buffer, so the head
/// borrows nothing and one `Head` is reused for every request on a connection.
#[derive(Debug, Clone)]
pub struct Head {
    pub method: Method,
    /// The request target without its query string.
    pub path: Range<usize>,
    /// The query string without its `?`.
    pub query: Option<Range<usize>>,
    /// (name, value) ranges in request order; values without surrounding whitespace.
    /// Cleared and refilled by every `parse_head`.
    pub headers: Vec<(Range<usize>, Range<usize>)>,
    pub framing: BodyFraming,
    /// The client waits for `100 Continue` before it sends the body (HTTP/1.1 only).
    pub expect_continue: bool,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    /// Bytes of the request line and headers, including the final blank line; the body
    /// starts here.
    pub head_len: usize,
    /// The first Content-Type value.
    pub content_type: Option<Range<usize>>,
    /// httparse's header array, kept between requests so parsing does not allocate.
    /// Always empty: httparse writes only into its spare capacity.
    header_slots: Vec<httparse::Header<'static>>,
}

impl Default for Head {
    fn default() -> Self {
        Head::new()
    }
}

impl Head {
    pub fn new() -> Head {
        Head {
            method: Method::Other,
            path: 0..0,
            query: None,
            headers: Vec::with_capacity(32),
            framing: BodyFraming::None,
            expect_continue: false,
            keep_alive: false,
            head_len: 0,
            content_type: None,
            header_slots: Vec::new(),
        }
    }

    /// The first header named `lower_name`, compared case-insensitively. `buf` must be
    /// the buffer this head was parsed from; a range outside it yields `None`.
    pub fn header<'b>(&self, buf: &'b [u8], lower_name: &str) -> Option<&'b [u8]> {
        self.headers.iter().find_map(|(name, value)| {
            let name = buf.get(name.clone())?;
            if name.eq_ignore_ascii_case(lower_name.as_bytes()) {
                buf.get(value.clone())
            } else {
                None
            }
        })
    }

    /// Resets every per-request field, so a head that failed to parse describes nothing.
    fn clear(&mut self) {
        self.method = Method::Other;
        self.path = 0..0;
        self.query = None;
        self.headers.clear();
        self.framing = BodyFraming::None;
        self.expect_continue = false;
        self.keep_alive = false;
        self.head_len = 0;
        self.content_type = None;
    }
}

/// Why a request was refused at the framing layer. Each maps to a status and a stable
/// short code for the JSON error body.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum HttpError {
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("HTTP version not supported; use HTTP/1.1")]
    UnsupportedVersion,
    #[error("request head is larger than {max} bytes")]
    HeadTooLarge { max: usize },
    #[error("more than {max} request headers")]
    TooManyHeaders { max: usize },
    #[error("content-length together with transfer-encoding is refused")]
    LengthAndChunked,
    #[error("invalid content-length")]
    BadContentLength,
    #[error("transfer-encoding other than chunked is not supported")]
    UnsupportedTransferEncoding,
    #[error("a body is required: send content-length or transfer-encoding: chunked")]
    LengthRequired,
    #[error("body is larger than {max} bytes")]
    BodyTooLarge { max: usize },
    #[error("malformed chunked body: {0}")]
    BadChunk(&'static str),
}

impl HttpError {
    pub fn status(&self) -> u16 {
        match self {
            HttpError::Malformed(_)
            | HttpError::LengthAndChunked
            | HttpError::BadContentLength
            | HttpError::BadChunk(_) => 400,
            HttpError::LengthRequired => 411,
            HttpError::BodyTooLarge { .. } => 413,
            HttpError::HeadTooLarge { .. } | HttpError::TooManyHeaders { .. } => 431,
            // RFC 9112 §6.1: a transfer coding the server does not implement is a 501.
            HttpError::UnsupportedTransferEncoding => 501,
            HttpError::UnsupportedVersion => 505,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            HttpError::Malformed(_) => "bad_request",
            HttpError::UnsupportedVersion => "http_version_not_supported",
            HttpError::HeadTooLarge { .. } => "headers_too_large",
            HttpError::TooManyHeaders { .. } => "too_many_headers",
            HttpError::LengthAndChunked => "ambiguous_framing",
            HttpError::BadContentLength => "bad_content_length",
            HttpError::UnsupportedTransferEncoding => "unsupported_transfer_encoding",
            HttpError::LengthRequired => "length_required",
            HttpError::BodyTooLarge { .. } => "payload_too_large",
            HttpError::BadChunk(_) => "bad_chunked_body",
        }
    }
}

/// A refusal past framing (routing, tenants, signatures, keys): status, stable code,
/// message for the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

/// Parses the request head at the start of `buf` into `head`.
///
/// `Ok(true)`: a complete head was parsed; the body (if any) starts at `head.head_len`.
/// `Ok(false)`: more bytes are needed, and `buf` is still within `header_bytes_max`.
/// Called again from the start of `buf` after every read; a head is small, so
/// re-parsing is cheaper than keeping parser state across reads.
pub fn parse_head(buf: &[u8], limits: &Limits, head: &mut Head) -> Result<bool, HttpError> {
    head.clear();
    let mut slots = recycle(std::mem::take(&mut head.header_slots));
    let result = parse_head_into(buf, limits, head, &mut slots);
    head.header_slots = recycle(slots);
    if result != Ok(true) {
        head.clear();
    }
    result
}

/// Reuses an (empty) header array's allocation for another buffer lifetime. The vector
/// is always empty, so nothing borrowed survives, and `Vec`'s in-place `collect` keeps
/// the allocation for a same-layout element type (a test checks that it does).
fn recycle<'to>(mut slots: Vec<httparse::Header<'_>>) -> Vec<httparse::Header<'to>> {
    slots.clear();
    slots.into_iter().map(|_| httparse::EMPTY_HEADER).collect()
}

fn parse_head_into<'b>(
    buf: &'b [u8],
    limits: &Limits,
    head: &mut Head,
    slots: &mut Vec<httparse::Header<'b>>,
) -> Result<bool, HttpError> {
    let header_count_max = limits.header_count_max;
    // One slot more than allowed, so "exactly the limit" and "over it" differ.
    let slot_count = header_count_max.saturating_add(1);
    slots.reserve(slot_count);
    let mut request = httparse::Request::new(&mut []);
    let status = request
        .parse_with_uninit_headers(buf, &mut slots.spare_capacity_mut()[..slot_count])
        .map_err(|error| match error {
            httparse::Error::TooManyHeaders => HttpError::TooManyHeaders {
                max: header_count_max,
            },
            httparse::Error::Version if names_http_version(buf) => HttpError::UnsupportedVersion,
            httparse::Error::Version | httparse::Error::Token | httparse::Error::Status => {
                HttpError::Malformed("invalid request line")
            }
            // Includes obs-fold: a continuation line starts with whitespace, which is not
            // a valid header-name byte.
            httparse::Error::HeaderName => HttpError::Malformed("invalid header name"),
            httparse::Error::HeaderValue => HttpError::Malformed("invalid header value"),
            httparse::Error::NewLine => HttpError::Malformed("invalid line ending"),
        });
    let head_len = match status? {
        // A partial head that already fills the limit can only complete over it.
        httparse::Status::Partial if buf.len() >= limits.header_bytes_max => {
            return Err(HttpError::HeadTooLarge {
                max: limits.header_bytes_max,
            });
        }
        httparse::Status::Partial => return Ok(false),
        httparse::Status::Complete(head_len) => head_len,
    };
    if head_len > limits.header_bytes_max {
        return Err(HttpError::HeadTooLarge {
            max: limits.header_bytes_max,
        });
    }
    if request.headers.len() > header_count_max {
        return Err(HttpError::TooManyHeaders {
            max: header_count_max,
        });
    }
    let (Some(method), Some(target), Some(minor_version)) =
        (request.method, request.path, request.version)
    else {
        return Err(HttpError::Malformed("incomplete request line"));
    };

    // Every non-empty slice httparse returns lies inside `buf`, so its offset is its
    // range; the bounds check only keeps an empty slice from elsewhere harmless.
    let base = buf.as_ptr() as usize;
    let range_of = |part: &[u8]| {
        let start = (part.as_ptr() as usize).wrapping_sub(base);
        if start <= buf.len() && part.len() <= buf.len() - start {
            start..start + part.len()
        } else {
            0..0
        }
    };
    head.method = Method::parse(method);
    let target_range = range_of(target.as_bytes());
    match target.find('?') {
        Some(at) => {
            head.path = target_range.start..target_range.start + at;
            head.query = Some(target_range.start + at + 1..target_range.end);
        }
        None => head.path = target_range,
    }
    head.head_len = head_len;

    let http_1_1 = minor_version == 1;
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut content_length: Option<usize> = None;
    let mut transfer_encoding_count = 0usize;
    let mut chunked = false;
    for header in request.headers.iter() {
        let name = header.name.as_bytes();
        let value = trim(header.value);
        head.headers.push((range_of(name), range_of(value)));
        if name.eq_ignore_ascii_case(b"content-length") {
            let parsed = parse_decimal(value).ok_or(HttpError::BadContentLength)?;
            // Repeats of one value are harmless (RFC 9112 §6.3); differing ones are not.
            if content_length.is_some_and(|previous| previous != parsed) {
                return Err(HttpError::BadContentLength);
            }
            content_length = Some(parsed);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding_count += 1;
            // Two headers amount to a list (`chunked, chunked`), which is not `chunked`.
            chunked = transfer_encoding_count == 1 && value.eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|byte| *byte == b',').map(trim) {
                connection_close |= token.eq_ignore_ascii_case(b"close");
                connection_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            // RFC 9110 §10.1.1: a 100-continue from an HTTP/1.0 client is ignored.
            head.expect_continue = http_1_1 && value.eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"content-type") && head.content_type.is_none() {
            head.content_type = Some(range_of(value));
        }
    }
    // `close` wins over `keep-alive`: closing is always safe.
    head.keep_alive = !connection_close && (http_1_1 || connection_keep_alive);

    head.framing = match (content_length, transfer_encoding_count) {
        (Some(_), 1..) => return Err(HttpError::LengthAndChunked),
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
        (None, 1..) if !http_1_1 => {
            return Err(HttpError::Malformed(
                "transfer-encoding in an HTTP/1.0 request",
            ))
        }
        (None, 1..) if !chunked => return Err(HttpError::UnsupportedTransferEncoding),
        (None, 1..) => BodyFraming::Chunked,
        (Some(length), _) if length > limits.body_max_bytes => {
            // Refused from the head, before a byte of the body is read.
            return Err(HttpError::BodyTooLarge {
                max: limits.body_max_bytes,
            });
        }
        (Some(length), _) => BodyFraming::Length(length),
        // A hook is a POST body; without framing it would silently be empty.
        (None, _) if head.method == Method::Post => return Err(HttpError::LengthRequired),
        (None, _) => BodyFraming::None,
    };
    Ok(true)
}

/// Whether the request line's third token claims to be an HTTP version, so an
/// unsupported version (`HTTP/2.0`) answers 505 and garbage answers 400.
fn names_http_version(buf: &[u8]) -> bool {
    let start = buf
        .iter()
        .position(|byte| *byte != b'\r' && *byte != b'\n')
        .unwrap_or(0);
    let line = buf[start..]
        .split(|byte| *byte == b'\n')
        .next()
        .unwrap_or_default();
    line.split(|byte| *byte == b' ')
        .filter(|token| !token.is_empty())
        .nth(2)
        .is_some_and(|token| token.starts_with(b"HTTP/"))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let is_space = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let start = bytes
        .iter()
        .position(|byte| !is_space(byte))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|byte| !is_space(byte))
        .map_or(start, |at| at + 1);
    &bytes[start..end]
}

/// Strict `1*DIGIT`: no sign, no whitespace inside, no list.
fn parse_decimal(bytes: &[u8]) -> Option<usize> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0usize, |total, byte| {
        let digit = (*byte as char).to_digit(10)?;
        total.checked_mul(10)?.checked_add(digit as usize)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of a chunk size.
    Size,
    /// Whitespace after the size, before `;` or CR.
    SizeSpace,
    /// A chunk extension, skipped up to CR.
    Extension,
    /// CR seen at the end of the size line; LF must follow.
    SizeLf,
    Data {
        remaining: usize,
    },
    /// The CR after a chunk's data.
    DataCr,
    /// The LF after a chunk's data.
    DataLf,
    /// Trailer lines after the last chunk, discarded; an empty line ends the body.
    Trailer,
    /// CR seen in the trailer section; `ends_body` when it began an empty line.
    TrailerLf {
        ends_body: bool,
    },
    Done,
}

/// Incremental chunked-body decoder (RFC 9112 §7.1). Bytes may arrive split anywhere,
/// including inside a CRLF or a size; the state between calls is a few words.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    /// The chunk size parsed so far.
    size: usize,
    /// Bytes of the current size line or trailer line, to bound them.
    line_len: usize,
    /// Trailer bytes so far, to bound the whole trailer section.
    trailer_len: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> ChunkedDecoder {
        ChunkedDecoder {
            state: ChunkState::Size,
            size: 0,
            line_len: 0,
            trailer_len: 0,
        }
    }

    /// Readies the decoder for the next body on the connection.
    pub fn reset(&mut self) {
        *self = ChunkedDecoder::new();
    }

    /// Decodes from `input`, appending body bytes to `out`. Returns the bytes consumed
    /// and whether the last chunk and its trailers are done; bytes after the end (a
    /// pipelined request) are not consumed. Fails with `BodyTooLarge` as soon as a chunk
    /// size would take `out` past `body_max`, before its data is read.
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        body_max: usize,
    ) -> Result<(usize, bool), HttpError> {
        let mut at = 0;
        while at < input.len() {
            if let ChunkState::Data { remaining } = self.state {
                // The hot case: copy the chunk's data in one piece.
                let take = remaining.min(input.len() - at);
                out.extend_from_slice(&input[at..at + take]);
                at += take;
                self.state = if take == remaining {
                    ChunkState::DataCr
                } else {
                    ChunkState::Data {
                        remaining: remaining - take,
                    }
                };
                continue;
            }
            if self.state == ChunkState::Done {
                return Ok((at, true));
            }
            let byte = input[at];
            at += 1;
            self.state = match self.state {
                // Both are handled before a byte is read.
                ChunkState::Data { .. } | ChunkState::Done => self.state,
                ChunkState::Size => {
                    self.count_line_byte()?;
                    let digits = self.line_len - 1;
                    match byte {
                        b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                            let digit = (byte as char).to_digit(16).unwrap_or_default();
                            self.size = self
                                .size
                                .checked_mul(16)
                                .and_then(|size| size.checked_add(digit as usize))
                                .ok_or(HttpError::BadChunk("chunk size overflows"))?;
                            ChunkState::Size
                        }
                        _ if digits == 0 => return Err(HttpError::BadChunk("missing chunk size")),
                        b' ' | b'\t' => ChunkState::SizeSpace,
                        b';' => ChunkState::Extension,
                        b'\r' => ChunkState::SizeLf,
                        _ => return Err(HttpError::BadChunk("invalid chunk size")),
                    }
                }
                ChunkState::SizeSpace => {
                    self.count_line_byte()?;
                    match byte {
                        b' ' | b'\t' => ChunkState::SizeSpace,
                        b';' => ChunkState::Extension,
                        b'\r' => ChunkState::SizeLf,
                        _ => return Err(HttpError::BadChunk("invalid chunk size")),
                    }
                }
                ChunkState::Extension => {
                    self.count_line_byte()?;
                    match byte {
                        b'\r' => ChunkState::SizeLf,
                        b'\t' => ChunkState::Extension,
                        // A bare LF or other control byte is where parsers disagree.
                        0..=0x1f | 0x7f => {
                            return Err(HttpError::BadChunk("invalid chunk extension"))
                        }
                        _ => ChunkState::Extension,
                    }
                }
                ChunkState::SizeLf => {
                    if byte != b'\n' {
                        return Err(HttpError::BadChunk("chunk size line not ended by CRLF"));
                    }
                    let size = std::mem::take(&mut self.size);
                    self.line_len = 0;
                    if size == 0 {
                        ChunkState::Trailer
                    } else if out.len().saturating_add(size) > body_max {
                        return Err(HttpError::BodyTooLarge { max: body_max });
                    } else {
                        ChunkState::Data { remaining: size }
                    }
                }
                ChunkState::DataCr if byte == b'\r' => ChunkState::DataLf,
                ChunkState::DataLf if byte == b'\n' => ChunkState::Size,
                ChunkState::DataCr | ChunkState::DataLf => {
                    return Err(HttpError::BadChunk("missing CRLF after chunk data"))
                }
                ChunkState::Trailer => {
                    self.count_trailer_byte()?;
                    match byte {
                        b'\r' => ChunkState::TrailerLf {
                            ends_body: self.line_len == 0,
                        },
                        b'\n' => return Err(HttpError::BadChunk("bare LF in trailers")),
                        _ => {
                            self.line_len += 1;
                            ChunkState::Trailer
                        }
                    }
                }
                ChunkState::TrailerLf { ends_body } => {
                    self.count_trailer_byte()?;
                    if byte != b'\n' {
                        return Err(HttpError::BadChunk("trailer line not ended by CRLF"));
                    }
                    self.line_len = 0;
                    if ends_body {
                        self.state = ChunkState::Done;
                        return Ok((at, true));
                    }
                    ChunkState::Trailer
                }
            };
        }
        Ok((at, self.state == ChunkState::Done))
    }

    /// Counts one byte of the trailer section against its bound.
    fn count_trailer_byte(&mut self) -> Result<(), HttpError> {
        self.trailer_len += 1;
        if self.trailer_len > TRAILER_BYTES_MAX {
            return Err(HttpError::BadChunk("trailers too large"));
        }
        Ok(())
    }

    /// Counts one byte of a size line against its bound.
    fn count_line_byte(&mut self) -> Result<(), HttpError> {
        self.line_len += 1;
        if self.line_len > CHUNK_LINE_MAX {
            return Err(HttpError::BadChunk("chunk size line too long"));
        }
        Ok(())
    }
}

/// The reason phrase for the statuses the gateway answers with.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Appends a complete response to `out`: status line, `content-type: application/json`
/// when the body is non-empty, `content-length`, `connection: close` when the
/// connection ends after it, `retry-after` when given, then `extra` headers and the body.
pub fn write_response(
    out: &mut Vec<u8>,
    status: u16,
    body: &[u8],
    keep_alive: bool,
    retry_after_s: Option<u32>,
    extra: &[(&str, &str)],
) {
    // Writing to a Vec cannot fail, so the io::Result values carry nothing.
    let _ = write!(out, "HTTP/1.1 {status} {}\r\n", reason(status));
    if !body.is_empty() {
        out.extend_from_slice(b"content-type: application/json\r\n");
    }
    let _ = write!(out, "content-length: {}\r\n", body.len());
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if let Some(seconds) = retry_after_s {
        let _ = write!(out, "retry-after: {seconds}\r\n");
    }
    for (name, value) in extra {
        // Extra headers come from our own code; a CR or LF would split the response.
        debug_assert!(!name.contains(['\r', '\n']) && !value.contains(['\r', '\n']));
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// Appends `{"error":"<code>","message":"<message>"}` to `out`, both JSON-escaped.
pub fn error_json(out: &mut Vec<u8>, code: &str, message: &str) {
    out.extend_from_slice(b"{\"error\":");
    json_string(out, code);
    out.extend_from_slice(b",\"message\":");
    json_string(out, message);
    out.push(b'}');
}

/// Appends `text` as a JSON string (RFC 8259 §7), without an intermediate allocation.
fn json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut plain_from = 0;
    for (at, byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            // Multi-byte UTF-8 needs no escaping in JSON.
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain_from..at]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{:04x}", byte);
        } else {
            out.extend_from_slice(escape);
        }
        plain_from = at + 1;
    }
    out.extend_from_slice(&bytes[plain_from..]);
    out.push(b'"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        body_max_bytes: 1024,
        header_count_max: 8,
        header_bytes_max: 512,
    };

    /// Parses `request` with [`LIMITS`] and checks the outcome.
    fn check(request: &[u8], expected: Result<bool, HttpError>) -> Head {
        let mut head = Head::new();
        let outcome = parse_head(request, &LIMITS, &mut head);
        assert_eq!(outcome, expected, "{:?}", String::from_utf8_lossy(request));
        head
    }

    /// Checks a refusal and the status and code it answers with.
    fn check_refused(request: &[u8], error: HttpError, status: u16, code: &str) {
        check(request, Err(error.clone()));
        assert_eq!((error.status(), error.code()), (status, code), "{error:?}");
    }

    #[test]
    fn a_post_with_content_length() {
        let request = b"POST /hooks/stripe?x=1&y HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\
                        Content-Type:  application/json \r\n\r\n{}";
        let head = check(request, Ok(true));
        assert_eq!(head.method, Method::Post);
        assert_eq!(&request[head.path.clone()], b"/hooks/stripe");
        assert_eq!(&request[head.query.clone().unwrap()], b"x=1&y");
        assert_eq!(head.framing, BodyFraming::Length(2));
        assert_eq!(head.head_len, request.len() - 2);
        assert!(head.keep_alive);
        assert!(!head.expect_continue);
        assert_eq!(
            &request[head.content_type.clone().unwrap()],
            b"application/json"
        );
        assert_eq!(
            head.header(request, "content-type"),
            Some(&b"application/json"[..])
        );
        assert_eq!(head.header(request, "host"), Some(&b"a"[..]));
        assert_eq!(head.header(request, "x-missing"), None);
        assert_eq!(head.headers.len(), 3);
    }

    #[test]
    fn header_lookup_is_case_insensitive_and_finds_the_first() {
        let request = b"GET / HTTP/1.1\r\nX-Sig: one\r\nx-sig: two\r\n\r\n";
        let head = check(request, Ok(true));
        assert_eq!(head.header(request, "x-sig"), Some(&b"one"[..]));
        assert_eq!(head.framing, BodyFraming::None);
        assert_eq!(head.query, None);
        // A different, shorter buffer yields nothing rather than a panic.
        assert_eq!(head.header(b"GET", "x-sig"), None);
    }

    #[test]
    fn every_prefix_of_a_head_waits_for_more() {
        let request = b"POST /hooks/a HTTP/1.1\r\nHost: a\r\ncontent-length: 0\r\n\r\n";
        for end in 0..request.len() {
            check(&request[..end], Ok(false));
        }
        check(request, Ok(true));
    }

    #[test]
    fn a_pipelined_request_after_the_head_is_not_consumed() {
        let request = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        let head = check(request, Ok(true));
        assert_eq!(&request[head.head_len..], b"GET /b HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_reused_head_is_refilled_and_its_header_array_is_not_reallocated() {
        let mut head = Head::new();
        let first = b"POST /a?q HTTP/1.1\r\na: 1\r\nb: 2\r\ncontent-length: 1\r\n\r\n";
        assert_eq!(parse_head(first, &LIMITS, &mut head), Ok(true));
        let (slots, capacity) = (head.header_slots.as_ptr(), head.header_slots.capacity());
        assert!(capacity > LIMITS.header_count_max);
        let second = b"GET /b HTTP/1.0\r\n\r\n".to_vec();
        assert_eq!(parse_head(&second, &LIMITS, &mut head), Ok(true));
        assert_eq!(
            (head.header_slots.as_ptr(), head.header_slots.capacity()),
            (slots, capacity)
        );
        assert!(head.headers.is_empty());
        assert_eq!(head.query, None);
        assert_eq!(&second[head.path.clone()], b"/b");
        assert_eq!(head.method, Method::Get);
        // A failed parse leaves nothing of the previous request behind.
        assert!(parse_head(b"BLAH\r\n\r\n", &LIMITS, &mut head).is_err());
        assert_eq!(
            (head.head_len, head.method, head.headers.len()),
            (0, Method::Other, 0)
        );
        assert_eq!(head.header_slots.as_ptr(), slots);
    }

    #[test]
    fn malformed_request_lines_and_headers_are_bad_requests() {
        let table: &[(&[u8], &'static str)] = &[
            (b"BLAH\r\n\r\n", "invalid request line"),
            (b"POST\r\n\r\n", "invalid request line"),
            (b"POST /a\r\n\r\n", "invalid request line"),
            (b"POST /a FOO/1.1\r\n\r\n", "invalid request line"),
            (b"PO(ST /a HTTP/1.1\r\n\r\n", "invalid request line"),
            (
                b"POST /a HTTP/1.1\r\nbad name: 1\r\n\r\n",
                "invalid header name",
            ),
            (b"POST /a HTTP/1.1\r\n: 1\r\n\r\n", "invalid header name"),
            (
                b"POST /a HTTP/1.1\r\nnocolon\r\n\r\n",
                "invalid header name",
            ),
            // obs-fold: a continuation line is refused, not joined.
            (
                b"POST /a HTTP/1.1\r\nx-a: 1\r\n  folded\r\ncontent-length: 0\r\n\r\n",
                "invalid header name",
            ),
            (
                b"POST /a HTTP/1.1\r\nx-a: 1\x00\r\n\r\n",
                "invalid header value",
            ),
            (
                b"POST /a HTTP/1.1\r\nx-a: 1\r2\r\n\r\n",
                "invalid header value",
            ),
        ];
        for (request, detail) in table {
            check_refused(request, HttpError::Malformed(detail), 400, "bad_request");
        }
    }

    #[test]
    fn versions_other_than_1_0_and_1_1_are_505() {
        for request in [
            &b"POST /a HTTP/2.0\r\n\r\n"[..],
            b"GET /a HTTP/1.2\r\n\r\n",
            b"GET / HTTP/0.9\r\n",
        ] {
            check_refused(
                request,
                HttpError::UnsupportedVersion,
                505,
                "http_version_not_supported",
            );
        }
    }

    #[test]
    fn content_length_with_transfer_encoding_is_refused() {
        let both = b"POST /a HTTP/1.1\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n";
        check_refused(both, HttpError::LengthAndChunked, 400, "ambiguous_framing");
        let reversed = b"POST /a HTTP/1.1\r\ntransfer-encoding: gzip\r\ncontent-length: 2\r\n\r\n";
        check(reversed, Err(HttpError::LengthAndChunked));
    }

    #[test]
    fn content_length_must_be_one_decimal_value() {
        let cases: &[&[u8]] = &[
            b"POST /a HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: 2x\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: +1\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: 1 2\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: 2, 2\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length:\r\n\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: 99999999999999999999999\r\n\r\n",
        ];
        for request in cases {
            check_refused(
                request,
                HttpError::BadContentLength,
                400,
                "bad_content_length",
            );
        }
        // Repeating one value is harmless.
        let same = b"POST /a HTTP/1.1\r\ncontent-length: 2\r\nContent-Length: 02\r\n\r\n";
        assert_eq!(check(same, Ok(true)).framing, BodyFraming::Length(2));
    }

    #[test]
    fn only_exactly_chunked_transfer_encoding_is_accepted() {
        for value in ["chunked", "Chunked", "CHUNKED ", " chunked"] {
            let request = format!("POST /a HTTP/1.1\r\ntransfer-encoding:{value}\r\n\r\n");
            assert_eq!(
                check(request.as_bytes(), Ok(true)).framing,
                BodyFraming::Chunked
            );
        }
        let cases: &[&[u8]] = &[
            b"POST /a HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            b"POST /a HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            b"POST /a HTTP/1.1\r\ntransfer-encoding: chunked, identity\r\n\r\n",
            b"POST /a HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            b"POST /a HTTP/1.1\r\ntransfer-encoding: xchunked\r\n\r\n",
            b"POST /a HTTP/1.1\r\ntransfer-encoding:\r\n\r\n",
        ];
        for request in cases {
            check_refused(
                request,
                HttpError::UnsupportedTransferEncoding,
                501,
                "unsupported_transfer_encoding",
            );
        }
        let old = b"POST /a HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n";
        check_refused(
            old,
            HttpError::Malformed("transfer-encoding in an HTTP/1.0 request"),
            400,
            "bad_request",
        );
    }

    #[test]
    fn a_post_without_framing_needs_a_length() {
        let request = b"POST /a HTTP/1.1\r\nhost: a\r\n\r\n";
        check_refused(request, HttpError::LengthRequired, 411, "length_required");
        // Other methods without framing simply have no body.
        let get = b"DELETE /a HTTP/1.1\r\nhost: a\r\n\r\n";
        assert_eq!(check(get, Ok(true)).framing, BodyFraming::None);
    }

    #[test]
    fn a_body_over_the_limit_is_refused_from_the_head() {
        let request = b"POST /a HTTP/1.1\r\ncontent-length: 1025\r\n\r\n";
        check_refused(
            request,
            HttpError::BodyTooLarge { max: 1024 },
            413,
            "payload_too_large",
        );
        let at_limit = b"POST /a HTTP/1.1\r\ncontent-length: 1024\r\n\r\n";
        assert_eq!(check(at_limit, Ok(true)).framing, BodyFraming::Length(1024));
    }

    fn with_headers(count: usize) -> Vec<u8> {
        let mut request = b"POST /a HTTP/1.1\r\ncontent-length: 0\r\n".to_vec();
        for i in 1..count {
            request.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        request
    }

    #[test]
    fn more_headers_than_the_limit_are_431() {
        assert_eq!(check(&with_headers(8), Ok(true)).headers.len(), 8);
        let error = HttpError::TooManyHeaders { max: 8 };
        // One over fits the spare slot; further over fails inside httparse.
        check_refused(&with_headers(9), error.clone(), 431, "too_many_headers");
        check_refused(&with_headers(40), error.clone(), 431, "too_many_headers");
        // Even before the head is complete.
        let partial = with_headers(40);
        check(&partial[..partial.len() - 2], Err(error));
    }

    #[test]
    fn a_head_over_the_byte_limit_is_431_complete_or_partial() {
        let error = HttpError::HeadTooLarge { max: 512 };
        let long = format!(
            "POST /a HTTP/1.1\r\nx: {}\r\ncontent-length: 0\r\n\r\n",
            "a".repeat(600)
        );
        check_refused(long.as_bytes(), error.clone(), 431, "headers_too_large");
        let partial = &long.as_bytes()[..512];
        check(partial, Err(error.clone()));
        check(&partial[..511], Ok(false));
        // Exactly at the limit is accepted, and a body after it does not count.
        let fill = 512 - "POST /a HTTP/1.1\r\ncontent-length: 600\r\nx: \r\n\r\n".len();
        let mut exact = format!(
            "POST /a HTTP/1.1\r\ncontent-length: 600\r\nx: {}\r\n\r\n",
            "a".repeat(fill)
        );
        assert_eq!(exact.len(), 512);
        exact.push_str(&"b".repeat(600));
        let limits = Limits {
            body_max_bytes: 4096,
            ..LIMITS
        };
        let mut head = Head::new();
        assert_eq!(parse_head(exact.as_bytes(), &limits, &mut head), Ok(true));
        assert_eq!(head.head_len, 512);
    }

    #[test]
    fn connection_and_expect() {
        let cases: &[(&[u8], bool, bool)] = &[
            (b"GET /a HTTP/1.1\r\n\r\n", true, false),
            (
                b"GET /a HTTP/1.1\r\nconnection: close\r\n\r\n",
                false,
                false,
            ),
            (
                b"GET /a HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n",
                false,
                false,
            ),
            (
                b"GET /a HTTP/1.1\r\nconnection: keep-alive\r\nconnection: close\r\n\r\n",
                false,
                false,
            ),
            (b"GET /a HTTP/1.0\r\n\r\n", false, false),
            (
                b"GET /a HTTP/1.0\r\nconnection: Keep-Alive\r\n\r\n",
                true,
                false,
            ),
            (
                b"GET /a HTTP/1.0\r\nconnection: keep-alive, close\r\n\r\n",
                false,
                false,
            ),
            (
                b"POST /a HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 2\r\n\r\n",
                true,
                true,
            ),
            (
                b"POST /a HTTP/1.1\r\nexpect: something\r\ncontent-length: 2\r\n\r\n",
                true,
                false,
            ),
            // HTTP/1.0 clients do not understand 100 Continue.
            (
                b"POST /a HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
                false,
                false,
            ),
        ];
        for (request, keep_alive, expect_continue) in cases {
            let head = check(request, Ok(true));
            let text = String::from_utf8_lossy(request);
            assert_eq!(
                (head.keep_alive, head.expect_continue),
                (*keep_alive, *expect_continue),
                "{text}"
            );
        }
    }

    #[test]
    fn methods() {
        let cases: &[(&[u8], Method)] = &[
            (b"GET / HTTP/1.1\r\n\r\n", Method::Get),
            (b"HEAD / HTTP/1.1\r\n\r\n", Method::Head),
            (b"PUT / HTTP/1.1\r\n\r\n", Method::Put),
            (b"DELETE / HTTP/1.1\r\n\r\n", Method::Delete),
            (b"PATCH / HTTP/1.1\r\n\r\n", Method::Patch),
            (b"OPTIONS * HTTP/1.1\r\n\r\n", Method::Options),
            (b"BREW / HTTP/1.1\r\n\r\n", Method::Other),
            (b"post / HTTP/1.1\r\n\r\n", Method::Other),
        ];
        for (request, method) in cases {
            assert_eq!(check(request, Ok(true)).method, *method);
        }
    }

    /// Decodes `input` in one call with a 1 KiB limit.
    fn decode_all(input: &[u8]) -> (Result<(usize, bool), HttpError>, Vec<u8>) {
        let mut decoder = ChunkedDecoder::new();
        let mut out = Vec::new();
        let outcome = decoder.decode(input, &mut out, 1024);
        (outcome, out)
    }

    #[test]
    fn chunked_decoding_handles_extensions_and_trailers() {
        let input = b"4;name=v;x=\"q\"\r\nWiki\r\n5 ; e\r\npedia\r\nA\r\n in chunks\r\n\
                      0;last\r\nx-trailer: 1\r\nx-other: 2\r\n\r\nNEXT";
        let (outcome, out) = decode_all(input);
        let (used, done) = outcome.unwrap();
        assert!(done);
        assert_eq!(out, b"Wikipedia in chunks");
        assert_eq!(&input[used..], b"NEXT");
        let (outcome, out) = decode_all(b"0\r\n\r\n");
        assert_eq!((outcome, out), (Ok((5, true)), Vec::new()));
    }

    #[test]
    fn a_finished_decoder_consumes_nothing_until_reset() {
        let mut decoder = ChunkedDecoder::new();
        let mut out = Vec::new();
        assert_eq!(
            decoder.decode(b"1\r\na\r\n0\r\n\r\n", &mut out, 10),
            Ok((11, true))
        );
        assert_eq!(
            decoder.decode(b"1\r\nb\r\n0\r\n\r\n", &mut out, 10),
            Ok((0, true))
        );
        decoder.reset();
        assert_eq!(
            decoder.decode(b"1\r\nb\r\n0\r\n\r\n", &mut out, 10),
            Ok((11, true))
        );
        assert_eq!(out, b"ab");
    }

    #[test]
    fn chunked_errors() {
        let cases: &[(&[u8], HttpError)] = &[
            (b"zz\r\n", HttpError::BadChunk("missing chunk size")),
            (b"\r\n", HttpError::BadChunk("missing chunk size")),
            (b" 1\r\n", HttpError::BadChunk("missing chunk size")),
            (b"1x\r\n", HttpError::BadChunk("invalid chunk size")),
            (b"1 2\r\n", HttpError::BadChunk("invalid chunk size")),
            (b"1\n", HttpError::BadChunk("invalid chunk size")),
            (
                b"1\rx",
                HttpError::BadChunk("chunk size line not ended by CRLF"),
            ),
            (b"1;a\nb", HttpError::BadChunk("invalid chunk extension")),
            (
                b"3\r\nabcX",
                HttpError::BadChunk("missing CRLF after chunk data"),
            ),
            (
                b"3\r\nabc\rX",
                HttpError::BadChunk("missing CRLF after chunk data"),
            ),
            (
                b"3\r\nabc\n",
                HttpError::BadChunk("missing CRLF after chunk data"),
            ),
            (
                b"10000000000000000\r\n",
                HttpError::BadChunk("chunk size overflows"),
            ),
            (b"401\r\n", HttpError::BodyTooLarge { max: 1024 }),
            (b"0\r\nx: 1\n", HttpError::BadChunk("bare LF in trailers")),
            (b"0\r\n\n", HttpError::BadChunk("bare LF in trailers")),
            (
                b"0\r\n\rx",
                HttpError::BadChunk("trailer line not ended by CRLF"),
            ),
        ];
        for (input, error) in cases {
            let (outcome, _) = decode_all(input);
            assert_eq!(
                outcome,
                Err(error.clone()),
                "{:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(
                error.status(),
                if error.code() == "payload_too_large" {
                    413
                } else {
                    400
                }
            );
        }
        let long_extension = format!("1;{}\r\n", "e".repeat(CHUNK_LINE_MAX));
        let (outcome, _) = decode_all(long_extension.as_bytes());
        assert_eq!(
            outcome,
            Err(HttpError::BadChunk("chunk size line too long"))
        );
        let long_trailers = format!("0\r\n{}", "x: y\r\n".repeat(TRAILER_BYTES_MAX / 6 + 1));
        let (outcome, _) = decode_all(long_trailers.as_bytes());
        assert_eq!(outcome, Err(HttpError::BadChunk("trailers too large")));
        // Leading zeros do not overflow.
        let (outcome, out) = decode_all(b"000000000000000000000001\r\na\r\n0\r\n\r\n");
        assert_eq!(
            (outcome.map(|(_, done)| done), out),
            (Ok(true), b"a".to_vec())
        );
    }

    #[test]
    fn the_body_limit_counts_across_chunks() {
        let mut decoder = ChunkedDecoder::new();
        let mut out = Vec::new();
        let input = b"3\r\nabc\r\n2\r\nde\r\n";
        assert_eq!(decoder.decode(input, &mut out, 5), Ok((input.len(), false)));
        assert_eq!(
            decoder.decode(b"1\r\n", &mut out, 5),
            Err(HttpError::BodyTooLarge { max: 5 })
        );
    }

    #[test]
    fn write_response_formats_every_header() {
        let mut out = Vec::new();
        write_response(&mut out, 429, b"{}", false, Some(3), &[("allow", "POST")]);
        assert_eq!(
            out,
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
              content-length: 2\r\nconnection: close\r\nretry-after: 3\r\nallow: POST\r\n\r\n{}"
        );
        out.clear();
        write_response(&mut out, 204, b"", true, None, &[]);
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n");
        out.clear();
        write_response(&mut out, 599, b"", true, None, &[]);
        assert!(out.starts_with(b"HTTP/1.1 599 Unknown\r\n"));
    }

    #[test]
    fn error_json_escapes() {
        let mut out = b"prefix:".to_vec();
        let message = "say \"hi\"\\ \n\r\t\u{1}\u{1f} é ✓ \u{7f}";
        error_json(&mut out, "bad_request", message);
        let value: serde_json::Value = serde_json::from_slice(&out[7..]).unwrap();
        assert_eq!(value["error"], "bad_request");
        assert_eq!(value["message"], message);
        assert_eq!(value.as_object().unwrap().len(), 2);
        out.clear();
        error_json(&mut out, "x", "plain");
        assert_eq!(out, br#"{"error":"x","message":"plain"}"#);
    }

    /// Chunk-encodes `body` with chunk sizes cycling through `sizes`, optionally adding
    /// extensions and trailers.
    fn chunk(body: &[u8], sizes: &[usize], decorate: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        for size in sizes.iter().cycle() {
            if at == body.len() {
                break;
            }
            let size = (*size).min(body.len() - at);
            if decorate && size % 2 == 0 {
                out.extend_from_slice(format!("{size:X} ;ext={at}\r\n").as_bytes());
            } else {
                out.extend_from_slice(format!("{size:x}\r\n").as_bytes());
            }
            out.extend_from_slice(&body[at..at + size]);
            out.extend_from_slice(b"\r\n");
            at += size;
        }
        out.extend_from_slice(if decorate {
            b"0;end\r\nx-t: 1\r\n\r\n"
        } else {
            b"0\r\n\r\n"
        });
        out
    }

    proptest! {
        // proptest prints the failing case and stores its seed in
        // proptest-regressions/, which later runs replay first.

        #[test]
        fn chunked_reassembles_across_any_read_boundaries(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            sizes in proptest::collection::vec(1usize..700, 1..8),
            reads in proptest::collection::vec(1usize..200, 1..16),
            decorate in any::<bool>(),
        ) {
            let mut encoded = chunk(&body, &sizes, decorate);
            let encoded_len = encoded.len();
            // A pipelined request after the body must be left alone.
            encoded.extend_from_slice(b"NEXT");
            let mut decoder = ChunkedDecoder::new();
            let mut out = Vec::new();
            // Bytes read but not yet consumed, as the connection's buffer holds them.
            let mut pending: Vec<u8> = Vec::new();
            let mut fed = 0;
            let mut reads_done = 0;
            loop {
                let take = reads[reads_done % reads.len()].min(encoded.len() - fed);
                pending.extend_from_slice(&encoded[fed..fed + take]);
                fed += take;
                reads_done += 1;
                let (used, done) = decoder.decode(&pending, &mut out, body.len()).unwrap();
                pending.drain(..used);
                if done {
                    break;
                }
                prop_assert!(fed < encoded.len(), "the decoder stalled");
            }
            prop_assert_eq!(out, body);
            prop_assert_eq!(fed - pending.len(), encoded_len);
        }

        #[test]
        fn chunked_decode_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            split in 0usize..600,
        ) {
            let mut decoder = ChunkedDecoder::new();
            let mut out = Vec::new();
            let split = split.min(bytes.len());
            if let Ok((used, false)) = decoder.decode(&bytes[..split], &mut out, 256) {
                let _ = decoder.decode(&bytes[used..], &mut out, 256);
            }
            prop_assert!(out.len() <= 256);
        }

        #[test]
        fn parse_head_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut head = Head::new();
            if let Ok(true) = parse_head(&bytes, &LIMITS, &mut head) {
                prop_assert!(head.head_len <= bytes.len());
                for (name, value) in &head.headers {
                    prop_assert!(name.end <= head.head_len && value.end <= head.head_len);
                }
            }
        }

        #[test]
        fn parse_head_never_panics_on_near_requests(
            prefix in prop::sample::select(vec![
                "POST /hooks/a HTTP/1.1\r\n",
                "GET / HTTP/1.0\r\n",
                "POST /a HTTP/1.1\r\ncontent-length: ",
                "POST /a HTTP/1.1\r\ntransfer-encoding: ",
            ]),
            rest in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut request = prefix.as_bytes().to_vec();
            request.extend_from_slice(&rest);
            let mut head = Head::new();
            let _ = parse_head(&request, &LIMITS, &mut head);
        }
    }
}
