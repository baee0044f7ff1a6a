//! What a capture records for one rank: its threads' kernel waits, its stack, its last output,
//! its store waits and its Python descendants. Shared by the capture (which fills it), the
//! suspect rules and the children's capture (which read it), so that none of them imports
//! another's code for a type.

use std::time::Duration;

use super::children::ChildCapture;
use super::pyspy::StackStatus;
use super::sample::ProcState;

/// One pending store wait of a rank: a key it waits for and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreWait {
    pub key: String,
    pub age: Duration,
}

/// One thread's kernel wait.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadWait {
    pub tid: i32,
    pub name: String,
    pub state: Option<ProcState>,
    /// `wchan` symbol; None when unreadable or `0` (running, or no ptrace-read right).
    pub wchan: Option<String>,
    /// Current syscall number; None when running or unreadable.
    pub syscall: Option<i64>,
}

/// Everything captured for one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct RankCapture {
    pub rank: u32,
    pub pid: i32,
    pub state: Option<ProcState>,
    /// Threads, main thread first.
    pub threads: Vec<ThreadWait>,
    pub stack_status: StackStatus,
    /// py-spy's text dump.
    pub stack: String,
    /// Main thread's frames, innermost first ("func (file:line)").
    pub main_frames: Vec<String>,
    pub last_output: Vec<String>,
    pub store_waits: Vec<StoreWait>,
    /// The rank's Python descendants (DataLoader workers ...), nearest first.
    pub children: Vec<ChildCapture>,
}

impl RankCapture {
    pub fn top_frame(&self) -> Option<&str> {
        self.main_frames.first().map(String::as_str)
    }
    pub fn main_wchan(&self) -> Option<&str> {
        self.threads.first().and_then(|t| t.wchan.as_deref())
    }
}
