//! A call's arguments as the handlers see them, and the identifiers they name or make.

use redis_module::{Context, RedisString};

use crate::args::non_empty;
use crate::error::SemError;
use crate::keys::{has_hash_tag, Command};
use crate::queue::SemKey;
use crate::server::command::Arg;
use crate::server::{in_cluster, selected_db};
use crate::store::SemKeys;

/// A SEM.* call's arguments, seen without the key names the command filter inserted.
pub struct Call<'a> {
    pub command: Command,
    /// The command name, the name, the derived names, then the other arguments.
    pub args: &'a [Arg],
    /// Where the other arguments start.
    rest: usize,
}

impl<'a> Call<'a> {
    /// A call must carry the derived names; one without them did not pass the filter, which no
    /// client can avoid. The name is checked first, before any other argument.
    pub fn new(ctx: &Context, args: &'a [Arg], command: Command) -> Result<Call<'a>, SemError> {
        let name = args[1].as_slice();
        non_empty(name, SemError::EmptyName)?;
        // Redis refuses keys of several slots (CROSSSLOT) before the call; this names the
        // cause for the rare name whose derived keys share its slot by chance.
        if in_cluster(ctx) && !has_hash_tag(name) {
            return Err(SemError::NeedsHashTag);
        }
        // The keys are there: the client or the filter sent them, or `with_keys` inserted them.
        let rest = 2 + command.derived_suffixes().len();
        Ok(Call {
            command,
            args,
            rest,
        })
    }

    /// The arguments after the name.
    pub fn options(&self) -> &'a [Arg] {
        &self.args[self.rest..]
    }

    /// The arguments after the name of a command with a fixed arity.
    pub fn exact_args<const N: usize>(&self) -> Result<&'a [Arg; N], SemError> {
        self.options()
            .try_into()
            .map_err(|_| SemError::Arity(self.command.name()))
    }

    /// The semaphore, as the waiting side names it.
    pub fn sem(&self, ctx: &Context) -> SemKey {
        SemKey {
            db: selected_db(ctx),
            name: self.args[1].as_slice().into(),
        }
    }

    /// The semaphore's key names.
    pub fn keys(&self) -> SemKeys<'a> {
        SemKeys {
            name: &self.args[1],
            owner: &self.args[2],
            counter: &self.args[3],
            permits: &self.args[4],
            limit: &self.args[5],
        }
    }
}

pub fn identifier(id: &RedisString) -> Result<&RedisString, SemError> {
    non_empty(id.as_slice(), SemError::EmptyIdentifier)?;
    Ok(id)
}

/// A random UUID v4 in its 36-character hyphenated form, written into `buffer`.
pub fn new_identifier(buffer: &mut [u8; 36]) -> &[u8] {
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(buffer)
        .as_bytes()
}
