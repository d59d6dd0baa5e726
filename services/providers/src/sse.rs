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
    buffer: Vec<u8>,
}

impl SseParser {
    /// Appends bytes and returns every event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        // Events are parsed where they lie; what they used is dropped from the buffer once, after
        // the last (a read often carries many events: draining each moved the rest every time).
        let mut start = 0;
        while let Some((end, separator)) = find_event_end(&self.buffer[start..]) {
            if let Some(event) = parse_block(&self.buffer[start..start + end]) {
                events.push(event);
            }
            start += end + separator;
        }
        self.buffer.drain(..start);
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
    let mut frame = Vec::with_capacity(256);
    frame.extend_from_slice(prefix.as_bytes());
    // The frames' parts are strings and integers: serializing them into a buffer cannot fail.
    if serde_json::to_writer(&mut frame, data).is_err() {
        tracing::error!("a stream frame could not be serialized");
    }
    frame.extend_from_slice(b"\n\n");
    // serde_json writes UTF-8 only; the lossy branch is never taken.
    String::from_utf8(frame).unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let mut index = 0;
    while index + 1 < buffer.len() {
        if buffer[index] == b'\n' && buffer[index + 1] == b'\n' {
            return Some((index, 2));
        }
        if index + 3 < buffer.len() && &buffer[index..index + 4] == b"\r\n\r\n" {
            return Some((index, 4));
        }
        index += 1;
    }
    None
}

fn parse_block(block: &[u8]) -> Option<SseEvent> {
    let text = String::from_utf8_lossy(block);
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
}
