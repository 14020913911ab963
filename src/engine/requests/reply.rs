//! The one answer a blocking caller waits for: a slot the writer fills once.
//!
//! A standard channel made for every request cost an allocation aligned to a cache line (about
//! 1,500 instructions with its free, two per two-phase pair) for one value. This is a slot in
//! an `Arc`, a lock and a condition variable. If the writer drops the request without
//! answering (it is gone), the waiter hears so instead of waiting forever.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

#[derive(Debug)]
enum State<T> {
    Waiting,
    Answered(T),
    /// The answering side was dropped without answering.
    Dropped,
}

#[derive(Debug)]
struct Slot<T> {
    state: Mutex<State<T>>,
    filled: Condvar,
}

/// The writer's side: answers once.
#[derive(Debug)]
pub(crate) struct Reply<T>(Arc<Slot<T>>);

/// The caller's side: waits for the answer.
#[derive(Debug)]
pub(crate) struct Waiter<T>(Arc<Slot<T>>);

/// A reply and its waiter.
pub(crate) fn reply<T>() -> (Reply<T>, Waiter<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Waiting),
        filled: Condvar::new(),
    });
    (Reply(slot.clone()), Waiter(slot))
}

impl<T> Reply<T> {
    /// Hands the answer to the waiter (if it still waits: a caller that gave up is not told).
    pub(crate) fn send(self, value: T) {
        self.fill(State::Answered(value));
    }

    fn fill(&self, filled: State<T>) {
        let mut state = self.0.state.lock();
        if matches!(*state, State::Waiting) {
            *state = filled;
            drop(state);
            self.0.filled.notify_one();
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        self.fill(State::Dropped);
    }
}

impl<T> Waiter<T> {
    /// The answer, or `None` if the writer dropped the request without one.
    pub(crate) fn recv(self) -> Option<T> {
        let mut state = self.0.state.lock();
        loop {
            match std::mem::replace(&mut *state, State::Dropped) {
                State::Answered(value) => return Some(value),
                State::Dropped => return None,
                State::Waiting => {
                    *state = State::Waiting;
                    self.0.filled.wait(&mut state);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_reaches_a_waiter_on_another_thread() {
        let (reply, waiter) = reply::<u32>();
        let sender = std::thread::spawn(move || reply.send(7));
        assert_eq!(waiter.recv(), Some(7));
        sender.join().expect("the sender");
    }

    #[test]
    fn a_reply_dropped_unanswered_wakes_its_waiter() {
        let (reply, waiter) = reply::<u32>();
        let dropper = std::thread::spawn(move || drop(reply));
        assert_eq!(waiter.recv(), None);
        dropper.join().expect("the dropper");
    }
}
