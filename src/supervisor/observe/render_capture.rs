//! The capture blocks' renderer: a hang verdict's capture block (the stacks and suspects the
//! watch task rendered, `HangFinding::block`) goes to rdrun's stderr as the verdict arrives,
//! before its `hang` event line.

use super::event::RunEvent;
use super::facts::{Facts, Renderer};

/// Prints the capture blocks (see the module docs).
pub struct CaptureRenderer;

impl Renderer for CaptureRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, _: &Facts) {
        if let RunEvent::Hang(found) = ev {
            if !found.block.is_empty() {
                crate::supervisor::output::own::stderr(&found.block);
            }
        }
    }
}
