//! Where the file route lives and how a file's URL is spelled: shared by
//! the route ([`super::files`]) and the executor, whose MCP answers name it.

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// Where the route is mounted.
pub const FILES_PREFIX: &str = "/files";

/// Characters escaped in a path segment of the route.
const SEGMENT: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`').add(b'{').add(b'}');

/// The route's path for `path` in `job` of `namespace`, each segment escaped.
pub fn route_path(namespace: &str, job: &str, path: &str) -> String {
    let encoded: Vec<String> = path.split('/').map(|seg| utf8_percent_encode(seg, SEGMENT).to_string()).collect();
    format!("{FILES_PREFIX}/{namespace}/{job}/{}", encoded.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_path_escapes_each_segment() {
        assert_eq!(route_path("team-a", "skj-1", "out/a b#1.txt"), "/files/team-a/skj-1/out/a%20b%231.txt");
        assert_eq!(route_path("team-a", "skj-1", "data.bin"), "/files/team-a/skj-1/data.bin");
    }
}
