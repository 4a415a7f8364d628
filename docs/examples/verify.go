// Package msgbuspush verifies a msgbus push (Standard Webhooks scheme) over its raw body, so it
// works for any body, JSON or not. Use it before reading the body:
//
//	body, _ := io.ReadAll(r.Body)
//	if err := msgbuspush.Verify(secret, r.Header, body, time.Now()); err != nil {
//		http.Error(w, "bad signature", http.StatusUnauthorized)
//		return
//	}
//
// The ce- headers are CloudEvents attributes (github.com/cloudevents/sdk-go/v2 reads them);
// ce-bizid is percent-encoded: url.PathUnescape(r.Header.Get("ce-bizid")).
package msgbuspush

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Tolerance refuses pushes signed longer ago than this (or as far ahead): replays.
const Tolerance = 5 * time.Minute

// Verify returns nil when one of the push's signatures is secret's over its raw body. During a
// secret rotation a push carries one signature per secret: either one passes.
func Verify(secret string, header http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return errors.New("the secret is not whsec_ + base64")
	}
	id, timestamp := header.Get("webhook-id"), header.Get("webhook-timestamp")
	seconds, err := strconv.ParseInt(timestamp, 10, 64)
	if id == "" || err != nil {
		return errors.New("not signed")
	}
	if math.Abs(now.Sub(time.Unix(seconds, 0)).Seconds()) > Tolerance.Seconds() {
		return errors.New("timestamp too far from now")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	expected := mac.Sum(nil)
	for _, entry := range strings.Fields(header.Get("webhook-signature")) {
		version, signature, _ := strings.Cut(entry, ",")
		given, err := base64.StdEncoding.DecodeString(signature)
		if version == "v1" && err == nil && hmac.Equal(given, expected) {
			return nil
		}
	}
	return errors.New("no matching signature")
}
