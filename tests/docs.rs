//! Documentation that is generated from the code stays in step with it.

const README: &str = include_str!("../README.md");

#[test]
fn the_readme_configuration_table_is_the_settings_table() {
    let begin = "<!-- settings:begin -->\n";
    let end = "<!-- settings:end -->";
    let start = README.find(begin).expect("README has the settings markers") + begin.len();
    let stop = README[start..]
        .find(end)
        .expect("README closes the settings markers")
        + start;
    let expected = orderd::app::settings_table();
    assert!(
        README[start..stop] == expected,
        "README's configuration table is stale; put this between the markers:\n{expected}"
    );
}
