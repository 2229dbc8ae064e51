-- 0014 (issue 16): a claim's lease value is never handed out twice for a job, even
-- when the claim that took it is lost, so the claim can commit asynchronously.
--
-- jobs.lease fences every write made for a claim (complete, settle, renew, a
-- handler's transaction with complete_in, ctx.once): it must differ from the value
-- of every earlier claim of the job. Before, a claim set lease = lease + 1, a pure
-- function of the row, and so the claim had to commit durably: a claim lost in a
-- server crash (its commit not yet flushed) leaves the row as it was before it, and
-- the next claim would compute the same value again, while the lost claim's worker
-- may still hold it and pass the fence (bench/RESULTS.md, Speed round three).
--
-- Now a lease value is the generation (one more per claim, as before) in its high
-- 31 bits and 32 random bits below: two claims of one job with the same generation
-- (a lost claim and the one made after the crash) get the same value only if they
-- draw the same 32 bits, 1 in 4,294,967,296 per lost claim; claims of different
-- generations always differ. random() is the session's generator, seeded from the
-- operating system's strong source when a backend first uses it, and every backend
-- is new after a server crash.
--
-- Every claim takes its lease from autom_lease_next (the claim in autom/db/queries.sql,
-- and any statement that inserts a job already claimed), and whoever shows a lease
-- shows autom_lease_generation(lease): the claim count, as lease itself was. Values
-- below 2^32 are leases written before this migration (the generation itself): the
-- next claim continues their count. A generation of 2^31 (two billion claims of one
-- job) would overflow into the sign bit.
create function autom_lease_generation(lease bigint)
returns bigint
language sql immutable parallel safe
as $$
    select case when lease < 4294967296 then lease else lease >> 32 end
$$;

create function autom_lease_next(lease bigint)
returns bigint
language sql volatile
as $$
    select ((autom_lease_generation(lease) + 1) << 32) | floor(random() * 4294967296)::bigint
$$;
