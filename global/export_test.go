package global

import "context"

// ReadRegion lets the external tests and benchmarks read a region's
// truth as a publisher does.
var ReadRegion = readRegion

// RegionDigest is the digest of a region's contribution as an aggregator
// holds it, and as a publisher computes it from what it read.
func RegionDigest(a *Aggregator, region string) (string, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.c.regions[region]
	if r == nil || !r.synced {
		return "", false
	}
	return digest(r.rooms, r.states), true
}

// TruthDigest is the digest of what ReadRegion read.
func TruthDigest(ctx context.Context, src RegionSource) (string, error) {
	t, err := readRegion(ctx, src, DefaultPageSize)
	if err != nil {
		return "", err
	}
	return digest(t.Members, t.States), nil
}

// RegionContribution is a region's rooms and states as an aggregator
// holds them (copies), for tests that compare them with the truth.
func RegionContribution(a *Aggregator, region string) (map[string]map[string][]string, map[string]map[string]map[string]string) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := a.c.regions[region]
	if r == nil {
		return nil, nil
	}
	rooms := map[string]map[string][]string{}
	for room, users := range r.rooms {
		rooms[room] = map[string][]string{}
		for u, ss := range users {
			rooms[room][u] = append([]string{}, ss...)
		}
	}
	states := map[string]map[string]map[string]string{}
	for room, users := range r.states {
		states[room] = map[string]map[string]string{}
		for u, st := range users {
			states[room][u] = map[string]string{}
			for s, j := range st {
				states[room][u][s] = j
			}
		}
	}
	return rooms, states
}

// Manual stops a publisher's cadence timer: the test (or benchmark) runs
// its cadences with RunCadence.
func Manual(c *PublisherConfig) { c.manual = true }

// RunCadence runs one cadence of p now.
func RunCadence(ctx context.Context, p *RegionPublisher) { p.cadence(ctx) }

// ForgetMember removes a member from an aggregator's copy of a region,
// as a bug would: the next digest must catch it.
func ForgetMember(a *Aggregator, region, room, user string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.c.regions[region]; r != nil {
		delete(r.rooms[room], user)
	}
}
