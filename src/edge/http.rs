//! STUB
use std::ops::Range;
pub struct Limits { pub body_max_bytes: usize, pub header_count_max: usize, pub header_bytes_max: usize }
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method { Post, Get, Head, Put, Delete, Patch, Options, Other }
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming { None, Length(usize), Chunked }
pub struct Head { pub method: Method, pub path: Range<usize>, pub query: Option<Range<usize>>, pub headers: Vec<(Range<usize>, Range<usize>)>, pub framing: BodyFraming, pub expect_continue: bool, pub keep_alive: bool, pub head_len: usize, pub content_type: Option<Range<usize>> }
impl Head { pub fn new() -> Self { todo!() } pub fn header<'b>(&self, _buf: &'b [u8], _n: &str) -> Option<&'b [u8]> { None } }
pub fn parse_head(_buf: &[u8], _limits: &Limits, _head: &mut Head) -> Result<bool, HttpError> { Ok(false) }
pub struct ChunkedDecoder;
impl ChunkedDecoder { pub fn new() -> Self { ChunkedDecoder } pub fn reset(&mut self) {} pub fn decode(&mut self, _i: &[u8], _o: &mut Vec<u8>, _m: usize) -> Result<(usize, bool), HttpError> { Ok((0, true)) } }
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError { #[error("bad")] Bad }
impl HttpError { pub fn status(&self) -> u16 { 400 } pub fn code(&self) -> &'static str { "" } }
pub fn write_response(_out: &mut Vec<u8>, _status: u16, _body: &[u8], _keep_alive: bool, _retry_after_s: Option<u32>, _extra: &[(&str, &str)]) {}
pub fn error_json(_out: &mut Vec<u8>, _code: &str, _message: &str) {}
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
