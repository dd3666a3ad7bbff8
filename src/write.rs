//! A write to one semaphore's keys, in the step it belongs to. Every writer, the module's
//! commands and its timer alike, changes a semaphore through a [`Write`] opened in a [`Step`]:
//! the writes of one command or timer step. A write's end, which no path can skip (it runs when
//! the handle goes, `?` included), only hands its open keys back to the `Step`; whoever made the
//! step then ends it with the serving step (`waiting::serve::serve_step`), which follows each
//! write on the same open keys, so a grant made for a waiter is replicated with what freed it,
//! in one MULTI/EXEC.

use std::cell::RefCell;

use redis_module::{Context, RedisString};

use crate::error::SemError;
use crate::queue::SemKey;
use crate::server::key::Access;
use crate::server::selected_db;
use crate::state;
use crate::store::{RedisStore, SemKeys};

/// The writes of one command, or of one step of the timer. A write's end hands its keys, still
/// open, back to its `Step`; whoever made the step serves it once the handler (or the timer's
/// step) is done.
pub struct Step<'a> {
    ctx: &'a Context,
    /// The writes kept for the end: the first inline (most calls write one semaphore, and
    /// need no allocation), then the others.
    first: RefCell<Option<Written<'a>>>,
    more: RefCell<Vec<Written<'a>>>,
}

/// A write that ended and may concern a waiter or a binding: its keys, still open.
pub struct Written<'a> {
    pub store: RedisStore<'a>,
    pub name: &'a RedisString,
    pub when: Serve,
}

impl<'a> Step<'a> {
    pub fn new(ctx: &'a Context) -> Step<'a> {
        Step {
            ctx,
            first: RefCell::new(None),
            more: RefCell::new(Vec::new()),
        }
    }

    /// Keeps a write that ended for the end of the step.
    fn written(&self, written: Written<'a>) {
        let mut first = self.first.borrow_mut();
        if first.is_none() {
            *first = Some(written);
        } else {
            self.more.borrow_mut().push(written);
        }
    }

    /// The end of the step, once its writes have ended: what they hand on, in order.
    pub fn end(self) -> (&'a Context, impl Iterator<Item = Written<'a>>) {
        let first = self.first.take();
        let more = self.more.take();
        (self.ctx, first.into_iter().chain(more))
    }
}

impl Drop for Step<'_> {
    /// Only checks that the step was ended: a panic (a bug) unwinding through a command leaves
    /// the lines to the next write or the timer, and nothing more runs on a state that may be
    /// half changed.
    fn drop(&mut self) {
        debug_assert!(
            std::thread::panicking()
                || (self.first.get_mut().is_none() && self.more.get_mut().is_empty()),
            "a step with writes was not served"
        );
    }
}

/// One semaphore's keys, open for a write in a [`Step`]; its end hands them back to the step
/// (a hand-over only: the step serves them when it is served).
pub struct Write<'r, 'a> {
    step: &'r Step<'a>,
    store: Option<RedisStore<'a>>,
    name: &'a RedisString,
    when: Serve,
    /// Whether the caller ended the write; one dropped on an error path ends it only if it
    /// changed a key (an error before any change leaves everything as it was).
    committed: bool,
}

/// When a write's end serves the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// If the write may have freed permits.
    IfFreed,
    /// Whatever the write: the timer writes because something else (a lease end, another
    /// client) changed the semaphore.
    Always,
    /// Never: a timer's survey that found a set waiter still does not fit and changed nothing
    /// (serving would only hand that waiter back to the timer).
    Never,
}

impl<'r, 'a> Write<'r, 'a> {
    /// Opens the keys for writing. A key of the wrong type is an error before anything changes.
    pub fn open(step: &'r Step<'a>, keys: &SemKeys<'a>) -> Result<Write<'r, 'a>, SemError> {
        let mut store = RedisStore::open(step.ctx, keys, Access::Write)?;
        // While some connection holds BOUND permits, the removed holders are kept so their
        // bindings can go too.
        if state::any_bindings() {
            store.keep_removed();
        }
        Ok(Write {
            step,
            store: Some(store),
            name: keys.name,
            when: Serve::IfFreed,
            committed: false,
        })
    }

    /// Opens the keys from the timer, to serve the line whatever the write.
    pub fn open_to_serve(
        step: &'r Step<'a>,
        keys: &SemKeys<'a>,
    ) -> Result<Write<'r, 'a>, SemError> {
        let mut write = Write::open(step, keys)?;
        write.store_mut().keep_removed();
        write.when = Serve::Always;
        write.committed = true;
        Ok(write)
    }

    /// The semaphore, as the grant and the waiting side name it.
    pub fn sem(&self) -> (i32, &'a [u8]) {
        (selected_db(self.step.ctx), self.name.as_slice())
    }

    /// The semaphore, as the waiting side keys it.
    pub fn key(&self) -> SemKey {
        SemKey {
            db: selected_db(self.step.ctx),
            name: self.name.as_slice().into(),
        }
    }

    /// The semaphore's keys, to read.
    pub fn store(&self) -> &RedisStore<'a> {
        self.store.as_ref().expect("open until the write's end")
    }

    /// The semaphore's keys, to change.
    pub fn store_mut(&mut self) -> &mut RedisStore<'a> {
        self.store.as_mut().expect("open until the write's end")
    }

    /// Ends the write, changed or not (see [`Step`]).
    pub fn commit(mut self) {
        self.committed = true;
    }

    /// Ends a timer's write that changed nothing, without serving the line.
    pub fn close_unchanged(mut self) {
        self.when = Serve::Never;
        self.committed = true;
    }
}

impl Drop for Write<'_, '_> {
    /// The end of the write: one dropped on an error path before any change ends nothing.
    fn drop(&mut self) {
        let Some(store) = &self.store else {
            return;
        };
        let ended = self.committed || store.changed();
        // While nobody waits and nothing is bound (most calls), the keys close here.
        if !ended || (!state::queued_anywhere() && !state::any_bindings()) {
            return;
        }
        if let Some(store) = self.store.take() {
            self.step.written(Written {
                store,
                name: self.name,
                when: self.when,
            });
        }
    }
}
