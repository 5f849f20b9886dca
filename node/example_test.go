package node

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// presenceTokenHandler is a backend's GET /presence-token: an HS256 token
// for the logged-in user, with the rooms the app lets them into, for the
// browser client's getToken. currentUser is the app's session lookup.
func presenceTokenHandler(secret []byte, currentUser func(*http.Request) (id, team string, ok bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, team, ok := currentUser(r)
		if !ok {
			http.Error(w, "log in first", http.StatusUnauthorized)
			return
		}
		now := time.Now()
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub":   id,                                      // letters, digits, - _ = @ + ~; at most 64 bytes
			"rooms": []string{"team" + team + "-*", "lobby"}, // room ids, or prefixes ending in *
			"iat":   now.Unix(),
			"exp":   now.Add(time.Hour).Unix(), // the client fetches a new one before
		}).SignedString(secret)
		if err != nil {
			http.Error(w, "cannot sign", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = io.WriteString(w, tok)
	})
}

// A backend's token endpoint, fetched as the browser client's getToken
// does, and the claims a node reads from its answer.
func Example_presenceTokenEndpoint() {
	secret := []byte("a-secret-of-at-least-32-bytes-shared-with-the-nodes")
	session := func(r *http.Request) (string, string, bool) { // your login
		user := r.Header.Get("X-Demo-User")
		return user, "7", user != ""
	}
	srv := httptest.NewServer(presenceTokenHandler(secret, session))
	defer srv.Close()

	for _, user := range []string{"alice", ""} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/presence-token", nil)
		req.Header.Set("X-Demo-User", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		tok, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Println("without a login:", resp.StatusCode)
			continue
		}
		var c Claims // what a node reads
		_, err = jwt.ParseWithClaims(string(tok), &c, func(*jwt.Token) (any, error) { return secret, nil },
			jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired())
		fmt.Println(err, c.Subject, c.Rooms, c.ExpiresAt.Sub(c.IssuedAt.Time), resp.Header.Get("Cache-Control"))
	}
	// Output:
	// <nil> alice [team7-* lobby] 1h0m0s no-store
	// without a login: 401
}
