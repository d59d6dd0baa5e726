//! An incremental Server-Sent Events parser: bytes in, complete events out, nothing buffered beyond
//! the event being received.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

/// Feeds bytes, yields events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The start of an event whose end has not arrived yet.
    buffer: Vec<u8>,
}

impl SseParser {
    /// Appends bytes and returns every event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if self.buffer.is_empty() {
            // The usual read: whole events, parsed where they lie; only a partial last one is kept.
            let used = parse_events(bytes, 0, &mut events);
            self.buffer.extend_from_slice(&bytes[used..]);
        } else {
            // The buffer holds no event end (it was searched when it arrived), so the search starts
            // where a separator split across the two reads could begin: three bytes back.
            let resume = self.buffer.len().saturating_sub(3);
            self.buffer.extend_from_slice(bytes);
            let used = parse_events(&self.buffer, resume, &mut events);
            // What the events used is dropped once, after the last.
            self.buffer.drain(..used);
        }
        events
    }

    /// Whatever remains when the stream ends without a final blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let block = std::mem::take(&mut self.buffer);
        parse_block(&block)
    }
}

/// An SSE frame written to the client: `prefix` (`data: `, or an `event:` line and `data: `), `data`
/// serialized as JSON, and the blank line that ends the event. Straight into one buffer: no
/// `Value` tree and no second copy per frame.
pub(crate) fn frame(prefix: &str, data: &impl serde::Serialize) -> String {
    frame_between(prefix, data, "\n\n")
}

/// `data` serialized as JSON between `prefix` and `suffix` (which ends the event), in one buffer.
pub(crate) fn frame_between(prefix: &str, data: &impl serde::Serialize, suffix: &str) -> String {
    let mut frame = Vec::with_capacity(256.max(prefix.len() + suffix.len() + 64));
    frame.extend_from_slice(prefix.as_bytes());
    // The frames' parts are strings and integers: serializing them into a buffer cannot fail.
    if serde_json::to_writer(&mut frame, data).is_err() {
        tracing::error!("a stream frame could not be serialized");
    }
    frame.extend_from_slice(suffix.as_bytes());
    // serde_json writes UTF-8 only; the lossy branch is never taken.
    String::from_utf8(frame).unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

/// Parses every complete event in `bytes` (searching for event ends from `search`) into `events`;
/// returns how many bytes they used.
fn parse_events(bytes: &[u8], mut search: usize, events: &mut Vec<SseEvent>) -> usize {
    let mut start = 0;
    while let Some((end, separator)) = find_event_end(&bytes[search..]) {
        let end = search + end;
        if let Some(event) = parse_block(&bytes[start..end]) {
            events.push(event);
        }
        start = end + separator;
        search = start;
    }
    start
}

/// Where the first event in `buffer` ends (a blank line: `\n\n` or `\r\n\r\n`), and the length of
/// its separator. Newlines are found with `memchr`, not byte by byte: a stream's bytes are mostly text
/// between them.
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    for newline in memchr::memchr_iter(b'\n', buffer) {
        match buffer.get(newline + 1) {
            Some(b'\n') => return Some((newline, 2)),
            Some(b'\r') if newline > 0 && buffer[newline - 1] == b'\r' && buffer.get(newline + 2) == Some(&b'\n') => {
                return Some((newline - 1, 4));
            }
            _ => {}
        }
    }
    None
}

fn parse_block(block: &[u8]) -> Option<SseEvent> {
    // UTF-8 is checked a word at a time; only a block that fails is read lossily (which walks it
    // char by char).
    let text = match std::str::from_utf8(block) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(block),
    };
    let mut event = None;
    // The data lines joined by newlines, written as they come.
    let mut data = String::new();
    let mut data_lines = 0_usize;
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = Some(value.to_string()),
            "data" => {
                if data_lines > 0 {
                    data.push('\n');
                }
                data.push_str(value);
                data_lines += 1;
            }
            _ => {}
        }
    }
    if event.is_none() && data_lines == 0 {
        return None;
    }
    Some(SseEvent { event, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"event: message_start\nda").is_empty());
        let events = parser.push(b"ta: {\"a\":1}\n\n: comment\n\ndata: x\r\n\r\ndata: [DONE]\n\n");
        assert_eq!(
            events,
            vec![
                SseEvent { event: Some("message_start".to_string()), data: "{\"a\":1}".to_string() },
                SseEvent { event: None, data: "x".to_string() },
                SseEvent { event: None, data: "[DONE]".to_string() },
            ]
        );
        // Several data lines join with newlines; an empty data line still makes an event.
        let events = parser.push(b"data: a\ndata:\ndata: b\n\ndata:\n\nevent: ping\n\n");
        assert_eq!(
            events,
            vec![
                SseEvent { event: None, data: "a\n\nb".to_string() },
                SseEvent { event: None, data: String::new() },
                SseEvent { event: Some("ping".to_string()), data: String::new() },
            ]
        );
        // Carriage returns before the newline, and bytes that are not UTF-8, read as before.
        let events = parser.push(b"data: x\r\r\ndata: \xff\xfe!\n\n");
        assert_eq!(events, vec![SseEvent { event: None, data: "x\n\u{fffd}\u{fffd}!".to_string() }]);
        assert!(parser.push(b"data: tail").is_empty());
        assert_eq!(parser.finish().map(|event| event.data), Some("tail".to_string()));
    }

    /// The events of `stream` as a parser sees them when the stream arrives cut at `cuts`.
    fn events_in_pieces(stream: &[u8], cuts: &[usize]) -> (Vec<SseEvent>, Option<SseEvent>) {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            events.extend(parser.push(&stream[start..cut]));
            start = cut;
        }
        (events, parser.finish())
    }

    /// Event ends as the parser found them before it searched with `memchr`: byte by byte.
    fn event_ends_bytewise(buffer: &[u8]) -> Vec<(usize, usize)> {
        let mut ends = Vec::new();
        let mut index = 0;
        while index + 1 < buffer.len() {
            if buffer[index] == b'\n' && buffer[index + 1] == b'\n' {
                ends.push((index, 2));
                index += 2;
            } else if index + 3 < buffer.len() && &buffer[index..index + 4] == b"\r\n\r\n" {
                ends.push((index, 4));
                index += 4;
            } else {
                index += 1;
            }
        }
        ends
    }

    #[test]
    fn event_ends_are_found_where_a_byte_by_byte_search_finds_them() {
        let samples: [&[u8]; 7] = [
            b"data: a\n\ndata: b\r\n\r\ndata: c\n\n",
            b"\n\r\n\r\n\n\n\r\r\n\r\n\r\n\n",
            b"x\n\r\n\r\ny\r\n\nz\r\r\n\r\n",
            b"\r\n\r\r\n\r\n",
            b"data: {}\r\ndata: []\r\n\r\n: c\n\n",
            b"no end\r\n",
            b"",
        ];
        for sample in samples {
            let mut found = Vec::new();
            let mut offset = 0;
            while let Some((end, separator)) = find_event_end(&sample[offset..]) {
                found.push((offset + end, separator));
                offset += end + separator;
            }
            assert_eq!(found, event_ends_bytewise(sample), "{:?}", String::from_utf8_lossy(sample));
        }
    }

    #[test]
    fn a_stream_reads_the_same_however_it_is_cut() {
        let stream: &[u8] = b"event: message_start\ndata: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: caf\xc3\xa9\n\n\
            data: x\r\r\ndata: y\n\ndata: \xff!\n\n\n\nevent: ping\r\n\r\ndata: [DONE]\n\ndata: tail";
        let whole = events_in_pieces(stream, &[]);
        assert_eq!(whole.0.len(), 6, "{whole:?}");
        assert_eq!(whole.0[1].data, "café");
        assert_eq!(whole.0[3].data, "\u{fffd}!");
        assert_eq!(whole.1.as_ref().map(|event| event.data.as_str()), Some("tail"));
        // Every cut in two and in three, and one byte at a time: separators split across reads
        // (`\r\n` | `\r\n`, `\n` | `\n`) and multi-byte characters split across reads alike.
        for first in 0..=stream.len() {
            assert_eq!(events_in_pieces(stream, &[first]), whole, "cut at {first}");
            for second in first..=stream.len() {
                assert_eq!(events_in_pieces(stream, &[first, second]), whole, "cut at {first} and {second}");
            }
        }
        let bytes: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(events_in_pieces(stream, &bytes), whole);
    }
}
