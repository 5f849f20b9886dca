// Package bus carries presence over NATS: the subject tree, the versioned
// event encoding, the JetStream stream that keeps transitions, the query
// service and the embedded nats-server used when no NATS URL is given.
//
// # Subjects
//
//	presence.<region>.<room>.<kind>.<user>   a region's transitions
//	presence.global.<room>.<kind>.<user>     the cross-region view's transitions
//
// kind is online, offline or update. Ids never contain '.', '*', '>' or
// whitespace (package presence validates them), so each id is exactly one
// token and wildcards narrow cleanly:
//
//	presence.>                     everything
//	presence.*.room42.>            room42 in every region, and globally
//	presence.eu.*.offline.*        every departure in region eu
//	presence.global.>              only the global view
//
// "global" is therefore not a valid region name. Requests to the query
// service use presence-api.<region>.<endpoint>, outside presence.>, so a
// subscriber to presence.> sees transitions only.
package bus
