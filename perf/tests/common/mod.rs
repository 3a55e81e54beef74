//! Helpers shared by the integration tests.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;

/// (width, height, pixels that are neither white nor grey: the plotted lines and points)
/// in the left and right halves.
pub fn colored_pixels(path: &Path) -> (u32, u32, usize, usize) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let ch = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected color type {other:?}"),
    };
    let (mut left, mut right) = (0, 0);
    for (i, p) in buf[..info.buffer_size()].chunks_exact(ch).enumerate() {
        let (r, g, b) = (i32::from(p[0]), i32::from(p[1]), i32::from(p[2]));
        let saturated = (r - g).abs().max((g - b).abs()).max((r - b).abs()) > 60;
        if saturated {
            if (i as u32 % info.width) < info.width / 2 {
                left += 1;
            } else {
                right += 1;
            }
        }
    }
    (info.width, info.height, left, right)
}
