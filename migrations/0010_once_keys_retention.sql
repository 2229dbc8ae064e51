-- ctx.once keys are pruned after the longest retention (maintenance.prune): an
-- index on recorded_at keeps each hourly batch an index range scan, however many
-- effects were recorded.
create index autom_once_recorded_at on autom_once (recorded_at);
