//! Documentation that is generated from the code stays in step with it.

const CONFIGURATION: &str = include_str!("../docs/configuration.md");

#[test]
fn the_configuration_table_is_the_settings_table() {
    let begin = "<!-- settings:begin -->\n";
    let end = "<!-- settings:end -->";
    let start = CONFIGURATION
        .find(begin)
        .expect("docs/configuration.md has the settings markers")
        + begin.len();
    let stop = CONFIGURATION[start..]
        .find(end)
        .expect("docs/configuration.md closes the settings markers")
        + start;
    let expected = orderd::app::settings_table();
    assert!(
        CONFIGURATION[start..stop] == expected,
        "docs/configuration.md is stale; put this between the markers:\n{expected}"
    );
}
