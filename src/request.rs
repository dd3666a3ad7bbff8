//! What an acquire asks for: the one request type that a direct call, a set and a waiter share,
//! and the one parser of the options of `SEM.ACQUIRE`, `SEM.ACQUIREFAIR` and `SEM.ACQUIREALL`.
//! Plain data, table-tested here.

use crate::args::{non_empty, parse_count, parse_wait_ms};
use crate::error::SemError;
use crate::semaphore::AcquireRequest;
use crate::types::Kind;

/// What a caller asked of one semaphore, granted as if it asked again whenever it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub kind: Kind,
    pub limit: u64,
    pub lease_ms: i64,
    /// `COUNT n`, or a set's count for this semaphore.
    pub count: Option<u64>,
    /// The identifier it will hold: given with ID, or made when it arrived (a single acquire
    /// fills it in only when it waits).
    pub holder: Vec<u8>,
    pub with_ticket: bool,
    pub bound: bool,
}

impl Ask {
    /// The one way an acquire's ask is made: a single acquire's or one semaphore of a set's,
    /// from the options its command parsed.
    pub fn new<A>(
        options: &Options<A>,
        limit: u64,
        lease_ms: i64,
        count: Option<u64>,
        holder: Vec<u8>,
    ) -> Ask {
        Ask {
            kind: options.kind,
            limit,
            lease_ms,
            count,
            holder,
            with_ticket: options.with_ticket,
            bound: options.bound,
        }
    }

    /// The acquire rule's request, with the lowest ticket this node may hand out now.
    pub fn rule(&self, ticket_floor: u64) -> AcquireRequest {
        AcquireRequest {
            kind: self.kind,
            limit: self.limit,
            lease_ms: self.lease_ms,
            count: self.count,
            ticket_floor,
        }
    }

    /// The connection a grant binds the permit to (BOUND): connection `client`, the caller's.
    pub fn bind_to(&self, client: u64) -> Option<u64> {
        self.bound.then_some(client)
    }
}

/// Which command's options: a single acquire (its kind fixed by the command) or a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Single(Kind),
    Set,
}

/// The options of an acquire, as parsed; `id` is the caller's argument itself.
#[derive(Debug, PartialEq, Eq)]
pub struct Options<'a, A> {
    pub id: Option<&'a A>,
    pub kind: Kind,
    pub with_ticket: bool,
    pub wait_ms: Option<i64>,
    pub bound: bool,
    /// `COUNT n` (single acquires only: a set names a count per semaphore).
    pub count: Option<u64>,
}

/// Parses `[ID identifier] [COUNT n] [FAIR] [WITHTICKET] [WAIT seconds] [BOUND]` in any order,
/// each at most once: COUNT (at most `limit`) only for a single acquire, FAIR only for a set,
/// WITHTICKET only where fair. Anything else is `ERR syntax error`.
pub fn parse_options<'a, A>(
    form: Form,
    limit: u64,
    options: &'a [A],
    bytes: impl Fn(&A) -> &[u8],
) -> Result<Options<'a, A>, SemError> {
    let mut parsed = Options {
        id: None,
        kind: match form {
            Form::Single(kind) => kind,
            Form::Set => Kind::Plain,
        },
        with_ticket: false,
        wait_ms: None,
        bound: false,
        count: None,
    };
    let mut fair_named = false;
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let option = bytes(option);
        let mut value = || options.next().ok_or(SemError::Syntax);
        let is = |name: &[u8]| option.eq_ignore_ascii_case(name);
        if is(b"ID") && parsed.id.is_none() {
            let id = value()?;
            non_empty(bytes(id), SemError::EmptyIdentifier)?;
            parsed.id = Some(id);
        } else if is(b"WAIT") && parsed.wait_ms.is_none() {
            parsed.wait_ms = Some(parse_wait_ms(bytes(value()?))?);
        } else if is(b"BOUND") && !parsed.bound {
            parsed.bound = true;
        } else if is(b"WITHTICKET") && !parsed.with_ticket && form != Form::Single(Kind::Plain) {
            parsed.with_ticket = true;
        } else if is(b"COUNT") && parsed.count.is_none() && form != Form::Set {
            parsed.count = Some(parse_count(bytes(value()?), limit)?);
        } else if is(b"FAIR") && !fair_named && form == Form::Set {
            fair_named = true;
            parsed.kind = Kind::Fair;
        } else {
            return Err(SemError::Syntax);
        }
    }
    // A set names FAIR to get tickets.
    if parsed.with_ticket && parsed.kind != Kind::Fair {
        return Err(SemError::Syntax);
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = Result<
        (
            Option<&'static str>,
            Kind,
            bool,
            Option<i64>,
            bool,
            Option<u64>,
        ),
        SemError,
    >;

    fn parse(form: Form, args: &[&'static str]) -> Parsed {
        let options: Vec<&'static str> = args.to_vec();
        let parsed = parse_options(form, 5, &options, |a| a.as_bytes())?;
        Ok((
            parsed.id.copied(),
            parsed.kind,
            parsed.with_ticket,
            parsed.wait_ms,
            parsed.bound,
            parsed.count,
        ))
    }

    #[test]
    fn each_command_takes_its_own_options_once() {
        use Kind::{Fair, Plain};
        let plain = Form::Single(Plain);
        let fair = Form::Single(Fair);
        let table: &[(Form, &[&'static str], Parsed)] = &[
            (plain, &[], Ok((None, Plain, false, None, false, None))),
            (
                plain,
                &["id", "a", "WAIT", "1.5", "bound", "COUNT", "2"],
                Ok((Some("a"), Plain, false, Some(1500), true, Some(2))),
            ),
            (plain, &["WITHTICKET"], Err(SemError::Syntax)),
            (plain, &["FAIR"], Err(SemError::Syntax)),
            (
                fair,
                &["WITHTICKET"],
                Ok((None, Fair, true, None, false, None)),
            ),
            (fair, &["WITHTICKET", "WITHTICKET"], Err(SemError::Syntax)),
            (plain, &["ID", "a", "ID", "b"], Err(SemError::Syntax)),
            (plain, &["ID"], Err(SemError::Syntax)),
            (plain, &["ID", ""], Err(SemError::EmptyIdentifier)),
            (plain, &["COUNT", "6"], Err(SemError::InvalidCount)),
            (plain, &["WAIT"], Err(SemError::Syntax)),
            (plain, &["NOPE"], Err(SemError::Syntax)),
            (
                Form::Set,
                &["FAIR", "WITHTICKET"],
                Ok((None, Fair, true, None, false, None)),
            ),
            (Form::Set, &["WITHTICKET"], Err(SemError::Syntax)),
            (Form::Set, &["FAIR", "FAIR"], Err(SemError::Syntax)),
            (Form::Set, &["COUNT", "1"], Err(SemError::Syntax)),
            (
                Form::Set,
                &["BOUND", "wait", "0", "ID", "x"],
                Ok((Some("x"), Plain, false, Some(0), true, None)),
            ),
        ];
        for (form, args, expected) in table {
            assert_eq!(&parse(*form, args), expected, "{form:?} {args:?}");
        }
    }
}
