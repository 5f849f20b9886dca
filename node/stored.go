package node

import (
	"context"

	"github.com/presence-dev/presence/presence"
)

// announcing is the session keeper's view of the store: the transitions
// its claims and refreshes cause go to stored (the hub's) as soon as the
// store has them, beside their way through the region's outbox and the
// bus. A room's local members then see them one store round trip after
// the change instead of after the bus's store and republish too; members
// on other nodes, and every subscriber of the bus, still get them from
// the bus.
type announcing struct {
	Store
	stored func([]presence.Transition)
}

func (a *announcing) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	res, err := a.Store.Claim(ctx, refs)
	a.announce(res.Transitions)
	return res, err
}

func (a *announcing) Refresh(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	res, err := a.Store.Refresh(ctx, refs)
	a.announce(res.Transitions)
	return res, err
}

func (a *announcing) announce(ts []presence.Transition) {
	if len(ts) > 0 && a.stored != nil {
		a.stored(ts)
	}
}
