package turnwire

// Version is this client's release, the repository's VERSION file (tests/test_release_version.py
// checks they agree); its module version is "v" + Version.
const Version = "0.1.0"
