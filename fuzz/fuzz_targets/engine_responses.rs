//! What engines send back: Prometheus `/metrics` text and chat-completion SSE
//! streams, split into arbitrary chunks. Never a panic, and the SSE buffer
//! never keeps a complete event.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = pdwarden_agent::metrics::parse(&text);
    // Feed the stream in chunks cut at every 7th byte boundary we can.
    let mut buf = String::new();
    let mut done = false;
    for chunk in data.chunks(7) {
        buf.push_str(&String::from_utf8_lossy(chunk));
        for event in pdwarden_agent::suite::drain_sse_events(&mut buf) {
            if event == pdwarden_agent::suite::SseEvent::Done {
                done = true;
            }
        }
        if done {
            break;
        }
        assert!(!buf.contains("\n\n"), "a complete event was left in the buffer");
    }
});
